//! Mutual TLS on every link: the certificates `ringlock cert` makes, read
//! back, checked, and turned into rustls configurations for the peer
//! (Raft), lock and admin ports and for the client.
//!
//! rustls runs in user space (no kTLS): the server's io_uring loop and the
//! blocking client drive a [`rustls::ServerConnection`] or
//! [`rustls::ClientConnection`] from their own buffers. This module only
//! hands out the configurations and names the peer; it does no I/O except
//! reading the certificate files in [`NodeTls::load`], [`ClientTls::load`]
//! and [`list`].
//!
//! # The certs dir
//! One directory per node or client host, all PEM:
//!
//! | file | what | written by |
//! |---|---|---|
//! | `ca.crt` | the CA certificate, or several (a bundle, while a CA is rotated) | `ringlock cert create-ca`, then copied to every host |
//! | `node.crt`, `node.key` | the node's certificate (intermediates may follow it) and its key | `ringlock cert create-node` |
//! | `client.NAME.crt`, `client.NAME.key` | a client's certificate and key | `ringlock cert create-client` |
//!
//! The CA key is never read here: it is only needed to issue certificates
//! and lives wherever `--ca-key` said, off the nodes.
//!
//! # Identities
//! Every node and client certificate names exactly one identity, as a URI
//! subject alternative name: `ringlock://node/<id>` (id ≥ 1, decimal, no
//! leading zero) or `ringlock://client/<name>` (1 to 64 of `A-Z a-z 0-9 .
//! _ -`). A node certificate also names the node's hosts as DNS or IP
//! names, so a standard TLS client can check it by host name. See
//! [`Identity`] and [`identity_of`].
//!
//! # Invariants
//! - **The kind of identity is checked in the handshake.** Chaining to
//!   `ca.crt` is not enough: the peer port accepts only node certificates,
//!   the lock and admin ports only client certificates, a node dialling
//!   node N only node N's certificate, and a client only a node's
//!   certificate as the server. A client certificate never passes for a
//!   node nor a node's for a client.
//! - **The peer acceptor admits any node.** It cannot know which node
//!   ought to be calling; the link layer must compare the node id the
//!   peer claims (its link hello) with [`peer_identity`] and drop the
//!   link if they differ, so node 2's certificate never speaks for node 1.
//! - **TLS 1.3 only, no resumption, no 0-RTT.** Every configuration is
//!   built on the ring provider passed explicitly (never the process-wide
//!   default, which another library in the process could have set);
//!   servers send no tickets and keep no session cache, clients store no
//!   sessions and send no early data. Each connection is a full handshake
//!   with a fresh certificate check.
//! - **A load is checked before it returns.** [`NodeTls::load`] and
//!   [`ClientTls::load`] check that the key matches the certificate, the
//!   certificate chains to `ca.crt`, names the right kind of identity and
//!   is within its validity, and build every configuration; an error (it
//!   names the file and what is wrong) leaves the caller's current
//!   configuration in place, so a reload on SIGHUP can fail safely.
//! - **`ca.crt` is a bundle.** Everything that reads it trusts every CA
//!   certificate in it, so a new CA can be trusted beside the old one
//!   while certificates are re-issued.
//!
//! A leaf: imports nothing from the rest of the crate.

#[cfg(feature = "cli")]
pub mod gen;
#[cfg(all(test, feature = "cli"))]
pub(crate) mod testkit;
#[cfg(all(test, feature = "cli"))]
mod tests;

mod certfile;
mod identity;
mod provider;
mod verify;
use certfile::*;
pub use identity::{
    check_client_name, identity_of, peer_identity, Identity, CLIENT_NAME_MAX, CLIENT_URI_PREFIX,
    NODE_URI_PREFIX,
};
use provider::provider;
use verify::*;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::Resumption;
use rustls::pki_types::ServerName;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{NoServerSessionStorage, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// The CA bundle in a certs dir.
pub const CA_FILE: &str = "ca.crt";
/// A node's certificate in its certs dir.
pub const NODE_CERT_FILE: &str = "node.crt";
/// A node's private key in its certs dir.
pub const NODE_KEY_FILE: &str = "node.key";
/// `client.NAME.crt`: client NAME's certificate in a certs dir.
pub fn client_cert_file(name: &str) -> String {
    format!("client.{name}.crt")
}

/// `client.NAME.key`: client NAME's private key in a certs dir.
pub fn client_key_file(name: &str) -> String {
    format!("client.{name}.key")
}

/// The server name to dial node `node` with on [`NodeTls::peer_dialer`]
/// and [`ClientTls::config_for_node`] configurations: those check the
/// server's identity, not a host name, so any fixed name does; this one
/// reads well in traces. SNI is off on those configurations, so it is
/// never sent.
pub fn peer_server_name(node: u64) -> ServerName<'static> {
    ServerName::try_from(format!("ringlock-node-{node}"))
        .expect("ringlock-node-<digits> is a valid DNS name")
}

/// One certificate of a certs dir, for `ringlock cert list`.
#[derive(Debug, Clone)]
pub struct CertInfo {
    /// The file it is in.
    pub path: PathBuf,
    /// Its place in the file (0-based): a `ca.crt` bundle or a chain holds
    /// several.
    pub index: usize,
    /// How many certificates the file holds.
    pub count: usize,
    /// The subject's distinguished name, e.g. `CN=ringlock node 1`.
    pub subject: String,
    /// The issuer's distinguished name (the subject, for a CA's own).
    pub issuer: String,
    /// Which certificate of this dir's `ca.crt` issued it (0-based; a
    /// CA's own self-signed certificate names itself): the one whose key
    /// identifier its authority key identifier names, else the one whose
    /// subject is its issuer. `None` when `ca.crt` holds no such CA.
    pub issued_by: Option<usize>,
    /// A CA certificate (basic constraints `cA`).
    pub is_ca: bool,
    /// Its ringlock identity, or why it has none (always an error for a
    /// CA certificate).
    pub identity: Result<Identity, String>,
    /// Valid from.
    pub not_before: SystemTime,
    /// Valid until (inclusive).
    pub not_after: SystemTime,
}

/// Every certificate in every `*.crt` file of `certs_dir`: `ca.crt` first
/// (each CA of a bundle), then `node.crt`, then the clients' by name. An
/// error names the directory or the file that cannot be read or parsed.
pub fn list(certs_dir: &Path) -> Result<Vec<CertInfo>, String> {
    let entries = std::fs::read_dir(certs_dir)
        .map_err(|e| format!("{}: cannot list: {e}", certs_dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: cannot list: {e}", certs_dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".crt") && !name.starts_with('.') {
            let rank = match name.as_str() {
                CA_FILE => 0,
                NODE_CERT_FILE => 1,
                _ => 2,
            };
            files.push((rank, name, entry.path()));
        }
    }
    files.sort();
    let mut parsed = Vec::new();
    for (_, _, path) in files {
        let file = read(&path)?;
        let certs = pem_certs(&file)?;
        let count = certs.len();
        for (index, der) in certs.iter().enumerate() {
            let info =
                parse(der).map_err(|e| format!("{}: {e}", nth(&file.label, index, count)))?;
            parsed.push((path.clone(), index, count, info, identity_of(der)));
        }
    }
    // ca.crt sorts first: its certificates are the first `cas`.
    let cas = parsed
        .iter()
        .take_while(|(path, ..)| path.file_name().is_some_and(|f| f == CA_FILE))
        .count();
    let issued_by = |cert: &Parsed| {
        let by_key = cert.authority_key_id.as_ref().and_then(|aki| {
            parsed[..cas]
                .iter()
                .position(|(_, _, _, ca, _)| ca.key_id.as_ref() == Some(aki))
        });
        by_key.or_else(|| {
            parsed[..cas]
                .iter()
                .position(|(_, _, _, ca, _)| ca.subject_der == cert.issuer_der)
        })
    };
    let by: Vec<_> = parsed
        .iter()
        .map(|(_, _, _, info, _)| issued_by(info))
        .collect();
    Ok(parsed
        .into_iter()
        .zip(by)
        .map(
            |((path, index, count, info, identity), issued_by)| CertInfo {
                path,
                index,
                count,
                subject: info.subject,
                issuer: info.issuer,
                issued_by,
                is_ca: info.is_ca,
                identity,
                not_before: info.not_before,
                not_after: info.not_after,
            },
        )
        .collect())
}

/// A node's TLS: its certificate and key, the CA bundle, and the
/// configurations of its three ports and of its dials to other nodes.
/// Cheap to clone (one `Arc`); every configuration is shared.
#[derive(Clone)]
pub struct NodeTls {
    inner: Arc<NodeInner>,
}

struct NodeInner {
    node_id: u64,
    not_after: SystemTime,
    roots: Arc<RootCertStore>,
    key: Arc<CertifiedKey>,
    peer_acceptor: Arc<ServerConfig>,
    client_acceptor_required: Arc<ServerConfig>,
    client_acceptor_optional: Arc<ServerConfig>,
}

impl fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeTls")
            .field("node_id", &self.inner.node_id)
            .field("not_after", &self.inner.not_after)
            .finish_non_exhaustive()
    }
}

impl NodeTls {
    /// Reads `ca.crt`, `node.crt` and `node.key` from `certs_dir` and
    /// checks them (see the module's invariants): the key matches the
    /// certificate, which chains to a CA of `ca.crt` for both server and
    /// client use, names a node (node `expect_node`, when given) and is
    /// valid now. Every error names the file and what is wrong with it.
    pub fn load(certs_dir: &Path, expect_node: Option<u64>) -> Result<NodeTls, String> {
        let ca = read(&certs_dir.join(CA_FILE))?;
        let cert = read(&certs_dir.join(NODE_CERT_FILE))?;
        let key = read(&certs_dir.join(NODE_KEY_FILE))?;
        Self::checked(&ca, &cert, &key, expect_node)
    }

    /// As [`load`](Self::load), from PEM held in memory; errors name the
    /// parts `ca.crt`, `node.crt` and `node.key`.
    pub fn from_pem(
        ca_pem: &[u8],
        cert_pem: &[u8],
        key_pem: &[u8],
        expect_node: Option<u64>,
    ) -> Result<NodeTls, String> {
        let named = |label: &str, bytes: &[u8]| Pem {
            label: label.into(),
            bytes: bytes.to_vec(),
        };
        Self::checked(
            &named(CA_FILE, ca_pem),
            &named(NODE_CERT_FILE, cert_pem),
            &named(NODE_KEY_FILE, key_pem),
            expect_node,
        )
    }

    fn checked(ca: &Pem, cert: &Pem, key: &Pem, expect: Option<u64>) -> Result<NodeTls, String> {
        let roots = pem_roots(ca)?;
        let chain = pem_certs(cert)?;
        let key = certified_key(chain, key, &cert.label)?;
        let (identity, not_after) = check_end_entity(&key, &roots, cert, &ca.label, Use::Node)?;
        let node_id = match identity {
            Identity::Node(n) => n,
            Identity::Client(_) => unreachable!("check_end_entity refuses a client for Use::Node"),
        };
        if let Some(want) = expect.filter(|&want| want != node_id) {
            return Err(format!(
                "{}: is node {node_id}'s certificate, but this is node {want}",
                cert.label
            ));
        }
        Self::assemble(roots, key, node_id, not_after)
            .map_err(|e| format!("{}: cannot be used: {e}", cert.label))
    }

    /// Builds the configurations from parts already checked (tests build
    /// some from parts that fail the checks, to see the handshake refuse
    /// them).
    fn assemble(
        roots: Arc<RootCertStore>,
        key: Arc<CertifiedKey>,
        node_id: u64,
        not_after: SystemTime,
    ) -> Result<NodeTls, rustls::Error> {
        let verifier = |want, optional| -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
            let builder = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider());
            let builder = if optional {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            let inner = builder
                .build()
                .map_err(|e| rustls::Error::General(format!("client verifier: {e}")))?;
            Ok(Arc::new(IdentityClientVerifier { inner, want }))
        };
        Ok(NodeTls {
            inner: Arc::new(NodeInner {
                node_id,
                not_after,
                peer_acceptor: server_config(verifier(Want::AnyNode, false)?, &key)?,
                client_acceptor_required: server_config(verifier(Want::AnyClient, false)?, &key)?,
                client_acceptor_optional: server_config(verifier(Want::AnyClient, true)?, &key)?,
                roots,
                key,
            }),
        })
    }

    /// This node's id, from its certificate.
    pub fn node_id(&self) -> u64 {
        self.inner.node_id
    }

    /// When `node.crt` expires.
    pub fn not_after(&self) -> SystemTime {
        self.inner.not_after
    }

    /// The Raft port's configuration: requires a client certificate that
    /// chains to `ca.crt` and names a node (any node: the link layer must
    /// match [`peer_identity`] against the node the peer says it is).
    pub fn peer_acceptor(&self) -> Arc<ServerConfig> {
        self.inner.peer_acceptor.clone()
    }

    /// The configuration to dial node `node` with (use
    /// [`peer_server_name`]`(node)` as the server name): presents
    /// `node.crt`, accepts only a server certificate that chains to
    /// `ca.crt` and names node `node`; no host name check. Built on each
    /// call (no file I/O: a few allocations).
    pub fn peer_dialer(&self, node: u64) -> Arc<ClientConfig> {
        client_config(
            ServerVerifier::new(self.inner.roots.clone(), Want::Node(node), false),
            Some(&self.inner.key),
        )
    }

    /// The lock and admin ports' configuration: serves `node.crt`; a client
    /// certificate, when presented, must chain to `ca.crt` and name a
    /// client (never a node); `require_client_cert` refuses clients
    /// without one.
    pub fn client_acceptor(&self, require_client_cert: bool) -> Arc<ServerConfig> {
        if require_client_cert {
            self.inner.client_acceptor_required.clone()
        } else {
            self.inner.client_acceptor_optional.clone()
        }
    }
}

/// A client's TLS (the Rust client and the CLI): the CA bundle and,
/// optionally, the client's own certificate. Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    roots: Arc<RootCertStore>,
    key: Option<Arc<CertifiedKey>>,
    identity: Option<String>,
    not_after: Option<SystemTime>,
    config: Arc<ClientConfig>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("client", &self.inner.identity)
            .field("not_after", &self.inner.not_after)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Reads `ca.crt` from `certs_dir` and, with `client` = `Some(NAME)`,
    /// `client.NAME.crt` and `client.NAME.key`, checked as
    /// [`NodeTls::load`] checks a node's: the key matches, the certificate
    /// chains to `ca.crt` for client use, names client NAME and is valid
    /// now. Errors name the file and what is wrong.
    pub fn load(certs_dir: &Path, client: Option<&str>) -> Result<ClientTls, String> {
        let ca = read(&certs_dir.join(CA_FILE))?;
        let own = match client {
            None => None,
            Some(name) => {
                check_client_name(name)?;
                let cert = read(&certs_dir.join(client_cert_file(name)))?;
                let key = read(&certs_dir.join(client_key_file(name)))?;
                Some((cert, key, name))
            }
        };
        Self::checked(&ca, own.as_ref().map(|(c, k, n)| (c, k, Some(*n))))
    }

    /// As [`load`](Self::load), from PEM held in memory: the CA bundle and
    /// optionally a client certificate and its key (any client name);
    /// errors name the parts `ca.crt`, `client.crt` and `client.key`.
    pub fn from_pem(ca_pem: &[u8], client: Option<(&[u8], &[u8])>) -> Result<ClientTls, String> {
        let named = |label: &str, bytes: &[u8]| Pem {
            label: label.into(),
            bytes: bytes.to_vec(),
        };
        let own = client.map(|(c, k)| (named("client.crt", c), named("client.key", k)));
        Self::checked(
            &named(CA_FILE, ca_pem),
            own.as_ref().map(|(c, k)| (c, k, None)),
        )
    }

    fn checked(ca: &Pem, own: Option<(&Pem, &Pem, Option<&str>)>) -> Result<ClientTls, String> {
        let roots = pem_roots(ca)?;
        let (key, identity, not_after) = match own {
            None => (None, None, None),
            Some((cert, key, expect)) => {
                let key = certified_key(pem_certs(cert)?, key, &cert.label)?;
                let (identity, not_after) =
                    check_end_entity(&key, &roots, cert, &ca.label, Use::Client)?;
                let Identity::Client(name) = identity else {
                    unreachable!("check_end_entity refuses a node for Use::Client")
                };
                if let Some(want) = expect.filter(|want| *want != name) {
                    return Err(format!(
                        "{}: is client {name}'s certificate, not client {want}'s",
                        cert.label
                    ));
                }
                (Some(key), Some(name), Some(not_after))
            }
        };
        let config = client_config(
            ServerVerifier::new(roots.clone(), Want::AnyNode, true),
            key.as_ref(),
        );
        Ok(ClientTls {
            inner: Arc::new(ClientInner {
                roots,
                key,
                identity,
                not_after,
                config,
            }),
        })
    }

    /// The client name of the certificate presented, if any.
    pub fn client_name(&self) -> Option<&str> {
        self.inner.identity.as_deref()
    }

    /// When the client certificate expires, if there is one.
    pub fn not_after(&self) -> Option<SystemTime> {
        self.inner.not_after
    }

    /// The configuration for dialling a server by host name: standard
    /// certificate verification against `ca.crt` (the name dialled must be
    /// one of the node certificate's DNS or IP names), and the certificate
    /// must name a node. Presents the client certificate if one was loaded.
    pub fn config(&self) -> Arc<ClientConfig> {
        self.inner.config.clone()
    }

    /// The configuration for dialling node `node` whatever its address (a
    /// "not leader" hint names a node): the server's certificate must chain
    /// to `ca.crt` and name node `node`; no host name check (dial with
    /// [`peer_server_name`]`(node)`). Built on each call.
    pub fn config_for_node(&self, node: u64) -> Arc<ClientConfig> {
        client_config(
            ServerVerifier::new(self.inner.roots.clone(), Want::Node(node), false),
            self.inner.key.as_ref(),
        )
    }
}

const TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// A server configuration: TLS 1.3, `verifier` for client certificates,
/// no tickets, no session cache, no early data.
fn server_config(
    verifier: Arc<dyn ClientCertVerifier>,
    key: &Arc<CertifiedKey>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(TLS13_ONLY)?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(key.clone())));
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    config.max_early_data_size = 0;
    Ok(Arc::new(config))
}

/// A client configuration: TLS 1.3, `verifier` for the server, `key` as
/// the client certificate, no resumption, no early data. SNI only where
/// the host name is what is checked.
fn client_config(verifier: ServerVerifier, key: Option<&Arc<CertifiedKey>>) -> Arc<ClientConfig> {
    let sni = verifier.check_name;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(TLS13_ONLY)
        .expect("the ring provider supports TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier));
    let mut config = match key {
        Some(key) => {
            builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(key.clone())))
        }
        None => builder.with_no_client_auth(),
    };
    config.resumption = Resumption::disabled();
    config.enable_early_data = false;
    config.enable_sni = sni;
    Arc::new(config)
}
