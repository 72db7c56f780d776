//! Who a certificate speaks for: the one `ringlock://` URI subject
//! alternative name of every node and client certificate (the module
//! docs of `tls`, "Identities").

use std::fmt;

use rustls::CommonState;
use x509_parser::extensions::GeneralName;

/// The prefix of a node identity URI: `ringlock://node/<id>`.
pub const NODE_URI_PREFIX: &str = "ringlock://node/";
/// The prefix of a client identity URI: `ringlock://client/<name>`.
pub const CLIENT_URI_PREFIX: &str = "ringlock://client/";
/// The longest client name.
pub const CLIENT_NAME_MAX: usize = 64;

/// Who a certificate speaks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// Node `id` of the cluster (its `--node-id`, at least 1).
    Node(u64),
    /// A client: 1 to [`CLIENT_NAME_MAX`] of `A-Z a-z 0-9 . _ -`.
    Client(String),
}

impl Identity {
    /// The URI subject alternative name that carries this identity.
    pub fn uri(&self) -> String {
        match self {
            Identity::Node(id) => format!("{NODE_URI_PREFIX}{id}"),
            Identity::Client(name) => format!("{CLIENT_URI_PREFIX}{name}"),
        }
    }

    /// The certificate's common name: `ringlock node <id>` or
    /// `ringlock client <name>` (informative only: the URI is what counts).
    pub fn common_name(&self) -> String {
        format!("ringlock {self}")
    }

    /// Parses an identity URI, exactly as [`uri`](Self::uri) writes it:
    /// one spelling per identity (lower-case scheme and kind, a node id
    /// without sign or leading zero).
    pub fn from_uri(uri: &str) -> Result<Identity, String> {
        if let Some(id) = uri.strip_prefix(NODE_URI_PREFIX) {
            return parse_node_id(id)
                .map(Identity::Node)
                .map_err(|e| format!("identity URI {uri:?}: {e}"));
        }
        if let Some(name) = uri.strip_prefix(CLIENT_URI_PREFIX) {
            check_client_name(name).map_err(|e| format!("identity URI {uri:?}: {e}"))?;
            return Ok(Identity::Client(name.to_owned()));
        }
        Err(format!(
            "identity URI {uri:?} is neither {NODE_URI_PREFIX}<id> nor {CLIENT_URI_PREFIX}<name>"
        ))
    }
}

/// `node 3`, `client billing`.
impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Node(id) => write!(f, "node {id}"),
            Identity::Client(name) => write!(f, "client {name}"),
        }
    }
}

/// A node id as the URI writes it: decimal digits, no sign, no leading
/// zero, 1 to `u64::MAX`.
fn parse_node_id(s: &str) -> Result<u64, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("node id {s:?} is not a decimal number"));
    }
    if s.starts_with('0') {
        return Err(format!(
            "node id {s:?}: ids start at 1 and are written without leading zeros"
        ));
    }
    s.parse()
        .map_err(|_| format!("node id {s:?} does not fit in 64 bits"))
}

/// Checks a client name: 1 to [`CLIENT_NAME_MAX`] of `A-Z a-z 0-9 . _ -`
/// (it becomes part of a file name and a URI, so nothing else).
pub fn check_client_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > CLIENT_NAME_MAX {
        return Err(format!(
            "client name {name:?} has {} characters; it must have 1 to {CLIENT_NAME_MAX}",
            name.chars().count()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "client name {name:?}: {c:?} is not allowed (only A-Z a-z 0-9 . _ -)"
        ));
    }
    Ok(())
}

/// The identity an end-entity certificate (DER) names: its one
/// `ringlock://` URI subject alternative name. An error says what is
/// wrong: not a certificate, no such name, more than one, or a malformed
/// one (a URI whose scheme is `ringlock` in any case counts as one, so a
/// near miss is an error rather than ignored). Other URI names are ignored.
pub fn identity_of(end_entity_der: &[u8]) -> Result<Identity, String> {
    let (rest, cert) = x509_parser::parse_x509_certificate(end_entity_der)
        .map_err(|e| format!("not an X.509 certificate: {e}"))?;
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes follow the certificate's DER encoding",
            rest.len()
        ));
    }
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("its subject alternative names cannot be read: {e}"))?;
    let mut uris = Vec::new();
    for name in san.iter().flat_map(|san| &san.value.general_names) {
        match name {
            GeneralName::URI(uri)
                if uri
                    .get(..9)
                    .is_some_and(|s| s.eq_ignore_ascii_case("ringlock:")) =>
            {
                uris.push(*uri)
            }
            // [6] is uniformResourceIdentifier: one that is not text could
            // be a ringlock name nobody can read.
            GeneralName::Invalid(tag, _) if tag.0 == 6 => {
                return Err("a URI subject alternative name is not valid text".into())
            }
            _ => {}
        }
    }
    match uris.as_slice() {
        [] => Err(format!(
            "no ringlock identity: no {NODE_URI_PREFIX}<id> or {CLIENT_URI_PREFIX}<name> \
             URI subject alternative name (not a ringlock node or client certificate)"
        )),
        [uri] => Identity::from_uri(uri),
        many => Err(format!(
            "{} ringlock:// URI names ({}); a certificate names exactly one identity",
            many.len(),
            many.join(", ")
        )),
    }
}

/// The identity of the end-entity certificate the peer presented in a
/// completed handshake; `None` before the handshake is done, when the peer
/// presented no certificate (a client on `client_acceptor(false)`), or
/// when it names no valid identity (which the verifiers of this module
/// never let through).
pub fn peer_identity(conn: &CommonState) -> Option<Identity> {
    identity_of(conn.peer_certificates()?.first()?).ok()
}
