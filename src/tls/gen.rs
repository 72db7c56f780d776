//! Making certificates: what `ringlock cert` runs and what the tests use,
//! so that both make them the same way (cargo feature `cli`, which brings
//! rcgen).
//!
//! - Keys are ECDSA P-256, written as PKCS#8 PEM (`-----BEGIN PRIVATE
//!   KEY-----`); certificates are PEM.
//! - The CA: CN `ringlock CA` and OU `key <16 hex digits>` (from its
//!   key, so that an old and a new CA differ by name), basic constraints `cA` with path length 0
//!   (it signs end-entity certificates only), key usages certificate and
//!   CRL signing.
//! - A node: CN `ringlock node <id>`, the URI name `ringlock://node/<id>`
//!   and each host as a DNS or IP name, extended key usages serverAuth and
//!   clientAuth (peer links are mutual).
//! - A client: CN `ringlock client <name>`, the URI name
//!   `ringlock://client/<name>`, extended key usage clientAuth only.
//! - Validity starts [`BACKDATE`] before now (a host whose clock is a
//!   little behind still accepts a new certificate) and never outlasts the
//!   issuing CA's.
//!
//! Times are whatever the caller passes in [`Validity`]: tests make
//! expired certificates with it directly; `ringlock cert` only ever asks
//! for "from now, N days".

use std::fmt;
use std::net::IpAddr;
use std::ops::{Add, Sub};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, DnsName};
use rustls::{ClientConnection, ConnectionCommon, ServerConnection};

use super::{check_client_name, utc, Identity};

/// A new CA's lifetime: 10 years.
pub const CA_DAYS: u32 = 3650;
/// A node certificate's lifetime: 5 years.
pub const NODE_DAYS: u32 = 1826;
/// A client certificate's lifetime: 5 years.
pub const CLIENT_DAYS: u32 = 1826;
/// How long before its issue a certificate's validity starts.
pub const BACKDATE: Duration = Duration::from_secs(3600);

/// When a certificate is valid (both ends inclusive, whole seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Validity {
    /// From [`BACKDATE`] ago until `days` days from now.
    pub fn days(days: u32) -> Validity {
        let now = SystemTime::now();
        Validity {
            not_before: now - BACKDATE,
            not_after: now + Duration::from_secs(u64::from(days) * 86_400),
        }
    }
}

/// A certificate and its private key, PEM.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    /// The certificate's expiry (an issuer may shorten what was asked).
    pub not_after: SystemTime,
}

/// Leaves the key out.
impl fmt::Debug for Issued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issued")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// A new CA: a self-signed certificate and its key.
pub fn ca(validity: Validity) -> Result<Issued, String> {
    let key = new_key()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name("ringlock CA");
    // Two CAs (old and new, during a rotation) must not share a name: a
    // chain is matched to its CA by name first, and `cert list` should
    // tell them apart. The key's identifier tells them apart for good.
    let id: String = params.key_identifier(&key)[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    params
        .distinguished_name
        .push(DnType::OrganizationalUnitName, format!("key {id}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let not_after = set_validity(&mut params, validity.not_before, validity.not_after);
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("signing the CA certificate: {e}"))?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        not_after,
    })
}

/// A CA that can issue: its certificate (picked from a bundle by its key)
/// and its key.
pub struct Issuer {
    issuer: rcgen::Issuer<'static, KeyPair>,
    not_after: SystemTime,
}

impl fmt::Debug for Issuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Issuer")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// The CA whose key is `key_pem` (PKCS#8 PEM), found among the CA
    /// certificates of the bundle `ca_pem` (during a rotation `ca.crt`
    /// holds the old CA and the new one; the key says which signs). The
    /// labels name the two inputs in errors: the key is not a key, it is
    /// the key of no CA certificate in the bundle, or that CA has expired.
    pub fn from_pem(
        ca_label: &str,
        ca_pem: &[u8],
        key_label: &str,
        key_pem: &[u8],
    ) -> Result<Issuer, String> {
        let key_text = std::str::from_utf8(key_pem)
            .map_err(|_| format!("{key_label}: not a PEM file (not text)"))?;
        let key = KeyPair::from_pem(key_text)
            .map_err(|e| format!("{key_label}: not a PKCS#8 PEM private key: {e}"))?;
        let spki = key.subject_public_key_info();
        let certs = CertificateDer::pem_slice_iter(ca_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{ca_label}: not a readable PEM file: {e}"))?;
        if certs.is_empty() {
            return Err(format!(
                "{ca_label}: holds no certificate (no -----BEGIN CERTIFICATE----- block)"
            ));
        }
        for der in &certs {
            let (_, cert) = x509_parser::parse_x509_certificate(der)
                .map_err(|e| format!("{ca_label}: a certificate cannot be parsed: {e}"))?;
            if cert.public_key().raw != spki.as_slice() {
                continue;
            }
            if !cert.is_ca() {
                return Err(format!(
                    "{ca_label}: the certificate of {key_label} ({}) is not a CA certificate",
                    cert.subject()
                ));
            }
            let not_after = super::unix_time(cert.validity().not_after.timestamp());
            if SystemTime::now() > not_after {
                return Err(format!(
                    "{ca_label}: the CA of {key_label} expired at {}; make a new CA \
                     (see \"Rotating the CA\" in docs/security.md)",
                    utc(not_after)
                ));
            }
            let issuer = rcgen::Issuer::from_ca_cert_der(der, key)
                .map_err(|e| format!("{ca_label}: cannot issue with this CA: {e}"))?;
            return Ok(Issuer { issuer, not_after });
        }
        Err(format!(
            "{key_label} is not the key of any CA certificate in {ca_label} ({} certificate{}): \
             a key of another CA, or a ca.crt of another CA",
            certs.len(),
            if certs.len() == 1 { "" } else { "s" }
        ))
    }

    /// When this CA expires: no certificate it issues outlives it.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// A node certificate for node `node` (≥ 1) reachable as `hosts` (DNS
    /// names or IP addresses, at least one; see [`check_host`]).
    pub fn node(&self, node: u64, hosts: &[String], validity: Validity) -> Result<Issued, String> {
        if node == 0 {
            return Err("node ids start at 1".into());
        }
        if hosts.is_empty() {
            return Err("a node certificate names at least one host".into());
        }
        let mut names = Vec::with_capacity(hosts.len());
        for host in hosts {
            let san = host_name(host)?;
            if !names.contains(&san) {
                names.push(san);
            }
        }
        self.leaf(
            &Identity::Node(node),
            names,
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            validity,
        )
    }

    /// A client certificate for client `name` (see
    /// [`check_client_name`]).
    pub fn client(&self, name: &str, validity: Validity) -> Result<Issued, String> {
        check_client_name(name)?;
        self.leaf(
            &Identity::Client(name.to_owned()),
            Vec::new(),
            &[ExtendedKeyUsagePurpose::ClientAuth],
            validity,
        )
    }

    fn leaf(
        &self,
        identity: &Identity,
        hosts: Vec<SanType>,
        usages: &[ExtendedKeyUsagePurpose],
        validity: Validity,
    ) -> Result<Issued, String> {
        let key = new_key()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(&identity.common_name());
        let uri = identity
            .uri()
            .try_into()
            .map_err(|e| format!("{identity}: URI name: {e}"))?;
        params.subject_alt_names = std::iter::once(SanType::URI(uri)).chain(hosts).collect();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = usages.to_vec();
        // Lets other tools (openssl verify, browsers) find the issuer in a
        // bundle of CAs with the same name.
        params.use_authority_key_identifier_extension = true;
        let not_after = set_validity(
            &mut params,
            validity.not_before,
            validity.not_after.min(self.not_after),
        );
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| format!("signing {identity}'s certificate: {e}"))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after,
        })
    }
}

/// Checks a node's HOST: an IP address, or a DNS name a TLS client can
/// match (letters, digits, hyphens, dots; no wildcard, no brackets, no
/// port).
pub fn check_host(host: &str) -> Result<(), String> {
    host_name(host).map(drop)
}

fn host_name(host: &str) -> Result<SanType, String> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    DnsName::try_from(host)
        .map_err(|_| format!("host {host:?} is neither an IP address nor a valid DNS name"))?;
    let name = host
        .to_owned()
        .try_into()
        .map_err(|e| format!("host {host:?}: {e}"))?;
    Ok(SanType::DnsName(name))
}

fn new_key() -> Result<KeyPair, String> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| format!("generating an ECDSA P-256 key: {e}"))
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

/// Sets the validity to whole seconds and returns the expiry as written.
fn set_validity(
    params: &mut CertificateParams,
    not_before: SystemTime,
    not_after: SystemTime,
) -> SystemTime {
    params.not_before = at(rcgen::date_time_ymd(1970, 1, 1), not_before);
    params.not_after = at(rcgen::date_time_ymd(1970, 1, 1), not_after);
    whole_seconds(not_after)
}

/// `t` as the date type of rcgen's parameters (whose crate is not a
/// dependency of ours: reached through the epoch rcgen makes), in whole
/// seconds as X.509 writes them.
fn at<T: Add<Duration, Output = T> + Sub<Duration, Output = T>>(epoch: T, t: SystemTime) -> T {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => epoch + Duration::from_secs(d.as_secs()),
        Err(e) => epoch - Duration::from_secs(e.duration().as_secs()),
    }
}

fn whole_seconds(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => UNIX_EPOCH + Duration::from_secs(d.as_secs()),
        Err(e) => UNIX_EPOCH - Duration::from_secs(e.duration().as_secs()),
    }
}

/// Runs a handshake between `client` and `server` in memory (the bytes
/// each writes are fed to the other) until both are done or one fails:
/// the tests' and `ringlock cert`'s way to see two configurations agree.
/// The error says which side failed and why (for a certificate refused by
/// the client: `client: invalid peer certificate: ...`).
pub fn handshake(
    client: &mut ClientConnection,
    server: &mut ServerConnection,
) -> Result<(), String> {
    // A TLS 1.3 handshake takes two round trips; a few more leave room for
    // alerts.
    for _ in 0..16 {
        let to_server = pump(client, server).map_err(|e| format!("server: {e}"))?;
        let to_client = pump(server, client).map_err(|e| format!("client: {e}"))?;
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(());
        }
        if !to_server && !to_client {
            return Err("the handshake stalled: neither side has anything to send".into());
        }
    }
    Err("the handshake did not end".into())
}

/// Moves everything `from` wants to write into `to` and has `to` process
/// it; false when there was nothing to move.
fn pump<A, B>(
    from: &mut ConnectionCommon<A>,
    to: &mut ConnectionCommon<B>,
) -> Result<bool, rustls::Error> {
    let mut bytes = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut bytes)
            .expect("writing to a Vec cannot fail");
    }
    if bytes.is_empty() {
        return Ok(false);
    }
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        // Refused only when `to` holds too much unprocessed data, which
        // processing after each read prevents.
        to.read_tls(&mut rest)
            .map_err(|e| rustls::Error::General(format!("feeding the handshake: {e}")))?;
        to.process_new_packets()?;
    }
    Ok(true)
}
