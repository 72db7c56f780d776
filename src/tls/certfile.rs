//! Certificate files: PEM read and parsed, the CA's roots, a key and its
//! chain, and the checks an end-entity certificate must pass.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::client::verify_server_cert_signed_by_trust_anchor;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, InconsistentKeys, RootCertStore};
use x509_parser::extensions::ParsedExtension;

use super::identity::{identity_of, Identity};
use super::provider::provider;

/// A PEM file's bytes and the name its errors use (its path, or a part
/// name for PEM from memory).
pub(super) struct Pem {
    pub(super) label: String,
    pub(super) bytes: Vec<u8>,
}

pub(super) fn read(path: &Path) -> Result<Pem, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    Ok(Pem {
        label: path.display().to_string(),
        bytes,
    })
}

/// "FILE" for a file of one certificate, "FILE (certificate 2 of 3)"
/// otherwise.
pub(super) fn nth(label: &str, index: usize, count: usize) -> String {
    if count == 1 {
        label.to_owned()
    } else {
        format!("{label} (certificate {} of {count})", index + 1)
    }
}

/// Every CERTIFICATE block of a PEM file, in order; at least one.
pub(super) fn pem_certs(file: &Pem) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(&file.bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not a readable PEM file: {e}", file.label))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: holds no certificate (no -----BEGIN CERTIFICATE----- block)",
            file.label
        ));
    }
    Ok(certs)
}

/// The trust anchors of a CA bundle: every certificate in it, each of
/// which must be a CA certificate (a node's `node.crt` copied over
/// `ca.crt` is refused here rather than trusted as a root).
pub(super) fn pem_roots(ca: &Pem) -> Result<Arc<RootCertStore>, String> {
    let certs = pem_certs(ca)?;
    let count = certs.len();
    let mut roots = RootCertStore::empty();
    for (index, der) in certs.into_iter().enumerate() {
        let what = nth(&ca.label, index, count);
        let info = parse(&der).map_err(|e| format!("{what}: {e}"))?;
        if !info.is_ca {
            return Err(format!(
                "{what}: {} is not a CA certificate (ca.crt holds only the CA's)",
                info.subject
            ));
        }
        roots
            .add(der)
            .map_err(|e| format!("{what}: not usable as a trust anchor: {e}"))?;
    }
    Ok(Arc::new(roots))
}

/// The key in `key` (PEM), with `chain`, checked to match the chain's
/// first certificate.
pub(super) fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: &Pem,
    cert_label: &str,
) -> Result<Arc<CertifiedKey>, String> {
    let der = PrivateKeyDer::from_pem_slice(&key.bytes)
        .map_err(|e| format!("{}: no private key in PEM form: {e}", key.label))?;
    let signing = provider()
        .key_provider
        .load_private_key(der)
        .map_err(|e| format!("{}: unusable private key: {e}", key.label))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => Ok(Arc::new(certified)),
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => Err(format!(
            "{}: is not the key of {cert_label} (the certificate holds another public key)",
            key.label
        )),
        Err(e) => Err(format!(
            "{}: cannot tell whether it is the key of {cert_label}: {e}",
            key.label
        )),
    }
}

/// How an end-entity certificate is to be used.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
    /// Both ends of peer links, and the server of the lock and admin ports.
    Node,
    /// The client end of the lock and admin ports.
    Client,
}

/// Checks the end-entity certificate of `key` before anything uses it: it
/// names an identity of the right kind, is valid now, and chains to the CA
/// bundle for every use it will be put to. Returns its identity and expiry.
pub(super) fn check_end_entity(
    key: &CertifiedKey,
    roots: &Arc<RootCertStore>,
    cert: &Pem,
    ca_label: &str,
    usage: Use,
) -> Result<(Identity, SystemTime), String> {
    let label = &cert.label;
    let ee = &key.cert[0];
    let info = parse(ee).map_err(|e| format!("{label}: {e}"))?;
    let identity = identity_of(ee).map_err(|e| format!("{label}: {e}"))?;
    match (usage, &identity) {
        (Use::Node, Identity::Node(_)) | (Use::Client, Identity::Client(_)) => {}
        (Use::Node, _) => {
            return Err(format!(
                "{label}: is {identity}'s certificate, not a node's"
            ))
        }
        (Use::Client, _) => {
            return Err(format!(
                "{label}: is {identity}'s certificate, not a client's"
            ))
        }
    }
    let now = SystemTime::now();
    if now > info.not_after {
        return Err(format!(
            "{label}: expired at {} ({identity}); issue a new one",
            utc(info.not_after)
        ));
    }
    if now < info.not_before {
        return Err(format!(
            "{label}: not valid before {} (is this host's clock right?)",
            utc(info.not_before)
        ));
    }
    let unix_now = UnixTime::since_unix_epoch(
        now.duration_since(UNIX_EPOCH)
            .expect("the clock reads after 1970"),
    );
    let intermediates = &key.cert[1..];
    let chain_error = |what: &str, e: rustls::Error| match e {
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            format!("{label}: not issued by any CA in {ca_label}")
        }
        rustls::Error::InvalidCertificate(CertificateError::BadSignature) => format!(
            "{label}: not issued by any CA in {ca_label} (its issuer has the name of one \
             there, but another key signed it: another CA of the same name?)"
        ),
        e => format!("{label}: refused by {ca_label} as a {what} certificate: {e}"),
    };
    if usage == Use::Node {
        let parsed = ParsedCertificate::try_from(ee).map_err(|e| format!("{label}: {e}"))?;
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            roots,
            intermediates,
            unix_now,
            provider().signature_verification_algorithms.all,
        )
        .map_err(|e| chain_error("server", e))?;
    }
    // Nodes are clients too, on the peer links they dial.
    WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
        .build()
        .map_err(|e| format!("{ca_label}: {e}"))?
        .verify_client_cert(ee, intermediates, unix_now)
        .map_err(|e| chain_error("client", e))?;
    Ok((identity, info.not_after))
}

/// What this module reads of a certificate besides its identity.
pub(super) struct Parsed {
    pub(super) subject: String,
    pub(super) subject_der: Vec<u8>,
    pub(super) issuer: String,
    pub(super) issuer_der: Vec<u8>,
    pub(super) is_ca: bool,
    pub(super) not_before: SystemTime,
    pub(super) not_after: SystemTime,
    /// Subject key identifier.
    pub(super) key_id: Option<Vec<u8>>,
    /// The key identifier of the issuer's key.
    pub(super) authority_key_id: Option<Vec<u8>>,
}

pub(super) fn parse(der: &[u8]) -> Result<Parsed, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let validity = cert.validity();
    let (mut key_id, mut authority_key_id) = (None, None);
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => key_id = Some(id.0.to_vec()),
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                authority_key_id = aki.key_identifier.as_ref().map(|id| id.0.to_vec())
            }
            _ => {}
        }
    }
    Ok(Parsed {
        subject: cert.subject().to_string(),
        subject_der: cert.subject().as_raw().to_vec(),
        issuer: cert.issuer().to_string(),
        issuer_der: cert.issuer().as_raw().to_vec(),
        is_ca: cert.is_ca(),
        not_before: unix_time(validity.not_before.timestamp()),
        not_after: unix_time(validity.not_after.timestamp()),
        key_id,
        authority_key_id,
    })
}

pub(super) fn unix_time(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ`, for error messages.
pub(super) fn utc(t: SystemTime) -> String {
    crate::log::format_utc_time(t)
}
