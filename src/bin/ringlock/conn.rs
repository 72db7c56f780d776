//! The connection to the lock server behind every command but `cluster`,
//! `cert` and the doc commands: the client, its quick probe for the notes,
//! sessions, and the listings `reset` checks against.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use clap::parser::ValueSource;
use clap::ArgMatches;
use ringlock::client::{
    Client, Error, KeyInfo, KeyStream, RetryPolicy, Session, ToServerAddrs, DEFAULT_PORT,
};

use crate::args::{Cli, HoldArgs};
use crate::exit::{note, usage, Fail, EX_TEMPFAIL, EX_USAGE};
use crate::failure::{client_fail, lease_fail};
use crate::{bytes, keys, retry, tlsopt};

/// The client and what the notes need: a second client that asks `KEYS`
/// once, briefly, so an unreachable admin port (it is loopback-only by
/// default) never delays or fails the command itself. Session locks open
/// their own connection ([`Conn::session`]).
pub(crate) struct Conn {
    pub(crate) client: Client,
    pub(crate) probe: Client,
    /// `--addr` as given (host names kept for TLS verification).
    pub(crate) lock_text: String,
    pub(crate) source: Vec<u8>,
    pub(crate) retry: RetryPolicy,
    /// `--retry` was given on the command line (see `retry`).
    pub(crate) retry_asked: bool,
    pub(crate) auth: Option<Vec<u8>>,
}

impl Conn {
    pub(crate) fn new(cli: &Cli, matches: &ArgMatches, source: Vec<u8>) -> Result<Conn, Fail> {
        let named = |id: &str, flag: &str, env: &str| {
            if matches.value_source(id) == Some(ValueSource::EnvVariable) {
                env.to_string()
            } else {
                flag.to_string()
            }
        };
        // Resolved here for a message that names the flag; the builders take the text.
        let _lock: Vec<SocketAddr> =
            cli.addr
                .as_str()
                .to_server_addrs(DEFAULT_PORT)
                .map_err(|e| {
                    Fail(
                        EX_USAGE,
                        format!("{}: {e}", named("addr", "--addr", "RINGLOCK_ADDR")),
                    )
                })?;
        let admin: Option<Vec<SocketAddr>> = match &cli.admin_addr {
            Some(a) => Some(a.as_str().to_server_addrs(DEFAULT_PORT + 1).map_err(|e| {
                Fail(
                    EX_USAGE,
                    format!(
                        "{}: {e}",
                        named("admin_addr", "--admin-addr", "RINGLOCK_ADMIN_ADDR")
                    ),
                )
            })?),
            None => None,
        };
        let retry = if cli.retry.is_zero() {
            RetryPolicy::none()
        } else {
            RetryPolicy {
                max_elapsed: cli.retry,
                ..RetryPolicy::default()
            }
        };
        let auth = match &cli.auth_token_file {
            Some(path) => Some(read_auth_token(path).map_err(|e| {
                usage(format!(
                    "{}: {e}",
                    named(
                        "auth_token_file",
                        "--auth-token-file",
                        "RINGLOCK_AUTH_TOKEN_FILE"
                    )
                ))
            })?),
            None => None,
        };
        let retry_asked = matches.value_source("retry") == Some(ValueSource::CommandLine);
        let build = |retry: RetryPolicy, quick: bool| {
            // The lock port's source: a persistent lock's, at most 127
            // bytes (main refuses a longer one for it); a session's (up to
            // 255) is not sent there.
            let lc_source = if source.len() <= ringlock::client::SOURCE_LEN_MAX {
                source.clone()
            } else {
                Vec::new()
            };
            let mut b = Client::builder(cli.addr.as_str())
                .source(lc_source)
                .retry(retry)
                .on_retry(retry::handler(retry_asked));
            if let Some(t) = &auth {
                b = b.admin_auth_token(t.clone());
            }
            if admin.is_some() {
                b = b.admin_addr(cli.admin_addr.as_deref().unwrap_or_default());
            }
            b = tlsopt::client(b);
            if quick {
                b = b
                    .connect_timeout(Duration::from_secs(1))
                    .io_timeout(Duration::from_secs(2));
            }
            b.build()
                .map_err(|e| client_fail(&e, &named("source", "--source", "RINGLOCK_SOURCE")))
        };
        Ok(Conn {
            client: build(retry, false)?,
            probe: build(RetryPolicy::none(), true)?,
            lock_text: cli.addr.clone(),
            source,
            retry,
            retry_asked,
            auth,
        })
    }

    /// Opens a session with the lock port (retried like every request),
    /// with `--keepalive` and `--ping-timeout` if given. A replicated
    /// session (a cluster's) is resumed on another `--addr` when its
    /// connection fails, so CMD goes on: its locks are lost (and CMD
    /// stopped, exit 79) only if the session ends or the resume does not
    /// keep them. Each resume is noted on stderr.
    pub(crate) fn session(&self, what: &str, hold: &HoldArgs) -> Result<Session, Fail> {
        self.session_with(what, hold.keepalive, hold.ping_timeout)
    }

    /// [`session`](Self::session) with the keep-alive options given apart.
    pub(crate) fn session_with(
        &self,
        what: &str,
        keepalive: Option<std::time::Duration>,
        ping_timeout: Option<std::time::Duration>,
    ) -> Result<Session, Fail> {
        let mut b = tlsopt::session(Session::builder(self.lock_text.as_str()))
            .source(self.source.clone())
            .retry(self.retry)
            .on_retry(retry::handler(self.retry_asked))
            .on_resume(note);
        if let Some(auth) = &self.auth {
            b = b.auth_token(auth.clone());
        }
        if let Some(k) = keepalive {
            b = b.keepalive(k);
        }
        if let Some(t) = ping_timeout {
            b = b.ping_timeout(t);
        }
        b.connect().map_err(|e| lease_fail(&e, None, what))
    }

    /// The held keys among `keys`, from one quick `KEYS`, or `None` when
    /// the admin port does not answer.
    pub(crate) fn keys_for_notes(&self, keys: &[Vec<u8>]) -> Option<Vec<KeyInfo>> {
        listed(self.probe.keys_stream().ok()?, keys).ok()
    }

    /// Whether any holder matches, or `None` when that cannot be known.
    pub(crate) fn held(&self, pred: impl Fn(&KeyInfo) -> bool) -> Option<bool> {
        for k in holders_stream(&self.probe).ok()? {
            if pred(&k.ok()?) {
                return Some(true);
            }
        }
        Some(false)
    }

    /// "source S (endpoint E) for 1m05s", or why that is unknown.
    pub(crate) fn holder_of(&self, key: &[u8]) -> String {
        let found = self.probe.keys_stream().and_then(|mut s| {
            s.find(|k| k.as_ref().map_or(true, |k| k.key == key))
                .transpose()
        });
        match found {
            Ok(Some(k)) => format!(
                "source {} (endpoint {}) for {}",
                bytes::escape(&k.source),
                bytes::escape(k.endpoint.as_bytes()),
                keys::format_held(k.held_for(SystemTime::now()))
            ),
            Ok(None) => "someone else (no longer listed: it may be free now)".into(),
            Err(e) => format!("someone else (who is unknown: {e})"),
        }
    }
}

/// Every holder with its token and access (`KEYH`); from a server
/// without `KEYH` (before lock modes, where a key has one holder) `KEYX`;
/// from one without `KEYX` either (Locking-Center) the `UnexpectedEof` of
/// that attempt.
pub(crate) fn holders_stream(client: &Client) -> Result<KeyStream, Error> {
    match client.keyh_stream() {
        // An older ringlockd answers an unknown command `-` and closes
        // (seen as refused), Locking-Center closes at once: if KEYX is
        // refused too, that is its answer.
        Err(Error::Io(e))
            if matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::PermissionDenied
            ) =>
        {
            client.keyx_stream()
        }
        other => other,
    }
}

/// The entries of a listing whose key is one of `keys`: whatever the
/// number of held keys, only those are kept in memory.
pub(crate) fn listed(stream: KeyStream, keys: &[Vec<u8>]) -> Result<Vec<KeyInfo>, Error> {
    stream
        .filter(|k| k.as_ref().map_or(true, |k| keys.contains(&k.key)))
        .collect()
}

/// `reset KEY...` without `--force`: each holder of each key is reset
/// only if it still holds it as just listed (and shown on stderr), by its
/// fencing token (every reader of a shared key, every holder of a
/// semaphore); a holder that changed in between is left alone (exit 75).
pub(crate) fn reset_listed(conn: &Conn, keys: &[Vec<u8>], list: &[KeyInfo]) -> Result<u8, Fail> {
    let mut entries: Vec<(&[u8], u64)> = Vec::new();
    for key in keys {
        let mut found = false;
        for k in list.iter().filter(|k| &k.key == key) {
            found = true;
            // An exclusive holder's access goes without saying.
            let access = match k.access {
                Some(ringlock::core::Access::Semaphore(n)) => format!(", semaphore of {n}"),
                Some(ringlock::core::Access::Shared) => ", shared".to_string(),
                _ => String::new(),
            };
            note(&format!(
                "resetting {}: held by {} at {} since {}s ago ({} hold{access}, token {})",
                bytes::escape(key),
                bytes::escape(&k.source),
                bytes::escape(k.endpoint.as_bytes()),
                k.held_for(std::time::SystemTime::now()).as_secs(),
                k.mode.name(),
                k.token
            ));
            entries.push((key.as_slice(), k.token));
        }
        if !found {
            note(&format!(
                "{} was not held; nothing was reset",
                bytes::escape(key)
            ));
        }
    }
    if entries.is_empty() {
        return Ok(0);
    }
    let done = conn
        .client
        .reset_if(&entries)
        .map_err(|e| client_fail(&e, "reset"))?;
    let mut changed = false;
    for ((key, token), reset) in entries.iter().zip(done) {
        if !reset {
            changed = true;
            note(&format!(
                "{}: its holder changed after it was listed (token {} no longer holds it); nothing was reset, run reset again to see the new holder",
                bytes::escape(key),
                token
            ));
        }
    }
    Ok(if changed { EX_TEMPFAIL } else { 0 })
}

/// The secret of `--auth-token-file`: the file's bytes without trailing
/// whitespace, 1 to 255 of them (what the server reads from its own).
pub(crate) fn read_auth_token(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let mut bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    while bytes.last().is_some_and(|b| b.is_ascii_whitespace()) {
        bytes.pop();
    }
    if bytes.is_empty() || bytes.len() > 255 {
        return Err(format!(
            "{}: a token is 1 to 255 bytes, got {}",
            path.display(),
            bytes.len()
        ));
    }
    Ok(bytes)
}
