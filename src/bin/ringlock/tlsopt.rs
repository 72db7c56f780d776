//! `--certs-dir` and `--client`: the TLS every connection of this run
//! speaks (loaded once, before any connection), applied to each client
//! and session builder.

use std::path::Path;
use std::sync::OnceLock;

use ringlock::client::session::SessionBuilder;
use ringlock::client::ClientBuilder;
use ringlock::tls::ClientTls;

use crate::exit::{Fail, EX_CONFIG};

static TLS: OnceLock<Option<ClientTls>> = OnceLock::new();

/// Loads `ca.crt` (and `client.NAME.crt`/`.key` for `--client NAME`) from
/// `dir`; every later connection speaks TLS with them.
pub fn init(dir: Option<&Path>, client: Option<&str>) -> Result<(), Fail> {
    let tls = match (dir, client) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(Fail(
                crate::exit::EX_USAGE,
                "--client (RINGLOCK_CLIENT) needs --certs-dir (RINGLOCK_CERTS_DIR): the \
                 directory that holds ca.crt and client.NAME.crt"
                    .into(),
            ))
        }
        (Some(dir), client) => Some(
            ClientTls::load(dir, client)
                .map_err(|e| Fail(EX_CONFIG, format!("--certs-dir {}: {e}", dir.display())))?,
        ),
    };
    let _ = TLS.set(tls);
    Ok(())
}

fn get() -> Option<&'static ClientTls> {
    TLS.get().and_then(Option::as_ref)
}

pub fn client(b: ClientBuilder) -> ClientBuilder {
    match get() {
        Some(t) => b.tls(t.clone()),
        None => b,
    }
}

pub fn session(b: SessionBuilder) -> SessionBuilder {
    match get() {
        Some(t) => b.tls(t.clone()),
        None => b,
    }
}
