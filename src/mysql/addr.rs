//! `mysql://USER[:PASSWORD]@HOST[:PORT][/DB]` addresses and where the
//! password comes from. std only, built with or without the `mysql`
//! feature, so that a CLI built without it can still recognise such an
//! address and say why it cannot use it.
//!
//! The password may be in the address (percent-encoded), in the file named
//! by `$RINGLOCK_MYSQL_PASSWORD_FILE` (one trailing newline is dropped), or
//! in `$RINGLOCK_MYSQL_PASSWORD`; at most one of the three, so that nobody
//! has to guess which one won. Prefer the file or the variable: an argument
//! vector is readable by every user of the machine (`ps`).

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

/// The environment variable that may hold the password.
pub const PASSWORD_ENV: &str = "RINGLOCK_MYSQL_PASSWORD";
/// The environment variable that may name a file holding the password.
pub const PASSWORD_FILE_ENV: &str = "RINGLOCK_MYSQL_PASSWORD_FILE";
/// The MySQL port used when the address names none.
pub const DEFAULT_PORT: u16 = 3306;

const FORM: &str = "mysql://USER[:PASSWORD]@HOST[:PORT][/DB]";

/// True if `addr` is a MySQL address (scheme `mysql://` or `mariadb://`,
/// any case): the caller should hand it to this module, not to the
/// ringlockd client.
pub fn is_mysql_addr(addr: &str) -> bool {
    scheme_len(addr).is_some()
}

fn scheme_len(addr: &str) -> Option<usize> {
    ["mysql://", "mariadb://"].iter().find_map(|s| {
        let head = addr.get(..s.len())?;
        head.eq_ignore_ascii_case(s).then_some(s.len())
    })
}

/// A parsed MySQL address. `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq)]
pub struct MysqlAddr {
    /// The user name (never empty).
    pub user: String,
    /// The password, if one was given (see [`with_password_from_env`](Self::with_password_from_env)).
    pub password: Option<String>,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port ([`DEFAULT_PORT`] if the address has none).
    pub port: u16,
    /// The default database, if any.
    pub db: Option<String>,
}

/// Why an address or its password could not be used. Nothing was sent.
#[derive(Debug)]
#[non_exhaustive]
pub enum AddrError {
    /// The address does not have the documented form.
    Syntax(String),
    /// The password came from more than one place.
    PasswordTwice(String),
    /// The password file could not be read.
    PasswordFile {
        /// The file named by `$RINGLOCK_MYSQL_PASSWORD_FILE`.
        path: PathBuf,
        /// Why it could not be read.
        err: std::io::Error,
    },
    /// A password that is not UTF-8.
    PasswordEncoding(&'static str),
    /// The connection pool could not be built from the address.
    Pool(String),
}

impl fmt::Display for AddrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AddrError::Syntax(what) => write!(f, "bad MySQL address: {what} (the form is {FORM})"),
            AddrError::PasswordTwice(what) => {
                write!(
                    f,
                    "the MySQL password is given more than once ({what}): give it once"
                )
            }
            AddrError::PasswordFile { path, err } => write!(
                f,
                "cannot read the MySQL password file {} (${PASSWORD_FILE_ENV}): {err}",
                path.display()
            ),
            AddrError::PasswordEncoding(from) => {
                write!(f, "the MySQL password in {from} is not UTF-8")
            }
            AddrError::Pool(err) => write!(f, "cannot build the MySQL connection pool: {err}"),
        }
    }
}

impl std::error::Error for AddrError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AddrError::PasswordFile { err, .. } => Some(err),
            _ => None,
        }
    }
}

fn syntax(what: impl Into<String>) -> AddrError {
    AddrError::Syntax(what.into())
}

/// Decodes `%XX` escapes; the result must be UTF-8.
fn percent_decode(s: &str, what: &str) -> Result<String, AddrError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| syntax(format!("bad %-escape in the {what}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| syntax(format!("the {what} is not UTF-8 once decoded")))
}

impl MysqlAddr {
    /// Parses `mysql://USER[:PASSWORD]@HOST[:PORT][/DB]` (also
    /// `mariadb://`). User, password and database are percent-decoded; an
    /// IPv6 host is written in brackets. Query strings are refused rather
    /// than ignored.
    pub fn parse(addr: &str) -> Result<MysqlAddr, AddrError> {
        let rest =
            &addr[scheme_len(addr).ok_or_else(|| syntax("it does not start with mysql://"))?..];
        if rest.contains(['?', '#']) {
            return Err(syntax("options after '?' or '#' are not supported"));
        }
        let (authority, db) = match rest.split_once('/') {
            Some((a, d)) => (a, Some(d)),
            None => (rest, None),
        };
        let (userinfo, hostport) = authority
            .rsplit_once('@')
            .ok_or_else(|| syntax("the user is missing (USER@HOST)"))?;
        let (user, password) = match userinfo.split_once(':') {
            Some((u, p)) => (u, Some(percent_decode(p, "password")?)),
            None => (userinfo, None),
        };
        let user = percent_decode(user, "user")?;
        if user.is_empty() {
            return Err(syntax("the user is empty"));
        }
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| syntax("an IPv6 host lacks its closing ']'"))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| syntax("junk after the IPv6 host"))?,
                ),
            };
            (host, port)
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(syntax("the host is empty"));
        }
        if host.contains(['@', ':', '[', ']', ' ']) && !hostport.starts_with('[') {
            return Err(syntax(format!("bad host {host:?}")));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(syntax(format!("bad port {p:?} (1..65535)"))),
                Ok(n) => n,
            },
        };
        let db = match db {
            None | Some("") => None,
            Some(d) if d.contains('/') => return Err(syntax("the database name contains '/'")),
            Some(d) => Some(percent_decode(d, "database name")?),
        };
        Ok(MysqlAddr {
            user,
            password,
            host: host.to_string(),
            port,
            db,
        })
    }

    /// Fills in the password from `$RINGLOCK_MYSQL_PASSWORD_FILE` or
    /// `$RINGLOCK_MYSQL_PASSWORD`, looked up through `env` (pass
    /// `|k| std::env::var_os(k)`). More than one source, counting a
    /// password in the address, is an error. An empty variable counts as
    /// unset.
    pub fn with_password_from_env(
        mut self,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<MysqlAddr, AddrError> {
        let file = env(PASSWORD_FILE_ENV).filter(|v| !v.is_empty());
        let var = env(PASSWORD_ENV).filter(|v| !v.is_empty());
        let mut sources = Vec::new();
        if self.password.is_some() {
            sources.push("in the address");
        }
        if file.is_some() {
            sources.push(PASSWORD_FILE_ENV);
        }
        if var.is_some() {
            sources.push(PASSWORD_ENV);
        }
        if sources.len() > 1 {
            return Err(AddrError::PasswordTwice(sources.join(", ")));
        }
        if let Some(path) = file {
            let path = PathBuf::from(path);
            let text = std::fs::read(&path).map_err(|err| AddrError::PasswordFile {
                path: path.clone(),
                err,
            })?;
            let mut text = String::from_utf8(text)
                .map_err(|_| AddrError::PasswordEncoding(PASSWORD_FILE_ENV))?;
            // Files written by `echo` or an editor end in a newline that is
            // not part of the password.
            if text.ends_with('\n') {
                text.pop();
                if text.ends_with('\r') {
                    text.pop();
                }
            }
            self.password = Some(text);
        } else if let Some(v) = var {
            self.password = Some(
                v.into_string()
                    .map_err(|_| AddrError::PasswordEncoding(PASSWORD_ENV))?,
            );
        }
        Ok(self)
    }
}

impl fmt::Display for MysqlAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mysql://{}@", self.user)?;
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        write!(f, ":{}", self.port)?;
        if let Some(db) = &self.db {
            write!(f, "/{db}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for MysqlAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlAddr")
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("host", &self.host)
            .field("port", &self.port)
            .field("db", &self.db)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn parses_every_part_of_the_documented_form() {
        let a = MysqlAddr::parse("mysql://app:s%40cr%3At@db.example:3307/locks").unwrap();
        assert_eq!(a.user, "app");
        assert_eq!(a.password.as_deref(), Some("s@cr:t"));
        assert_eq!((a.host.as_str(), a.port), ("db.example", 3307));
        assert_eq!(a.db.as_deref(), Some("locks"));
        let b = MysqlAddr::parse("MariaDB://app@10.0.0.5").unwrap();
        assert_eq!(
            (b.host.as_str(), b.port, b.password, b.db),
            ("10.0.0.5", 3306, None, None)
        );
        let c = MysqlAddr::parse("mysql://u@[::1]:3310/").unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.db.as_deref()),
            ("::1", 3310, None)
        );
        assert_eq!(c.to_string(), "mysql://u@[::1]:3310");
        assert!(is_mysql_addr("mysql://u@h") && !is_mysql_addr("127.0.0.1:22119"));
    }

    #[test]
    fn refuses_malformed_addresses_with_a_reason() {
        for (bad, why) in [
            ("127.0.0.1:3306", "mysql://"),
            ("mysql://host:3306", "user is missing"),
            ("mysql://@host", "user is empty"),
            ("mysql://u@", "host is empty"),
            ("mysql://u@h:0", "bad port"),
            ("mysql://u@h:99999", "bad port"),
            ("mysql://u@h:x", "bad port"),
            ("mysql://u@h/db?ssl=1", "not supported"),
            ("mysql://u:%zz@h", "%-escape"),
            ("mysql://u@[::1", "closing"),
            ("mysql://u@h/a/b", "contains '/'"),
        ] {
            let err = MysqlAddr::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
            assert!(err.contains(FORM), "{bad}: {err}");
        }
    }

    #[test]
    fn the_password_comes_from_exactly_one_place_and_is_never_shown() {
        let a = MysqlAddr::parse("mysql://u@h").unwrap();
        let from_var = a
            .clone()
            .with_password_from_env(env_of(&[(PASSWORD_ENV, "pw1")]))
            .unwrap();
        assert_eq!(from_var.password.as_deref(), Some("pw1"));
        assert!(!format!("{from_var:?} {from_var}").contains("pw1"));

        let dir = std::env::temp_dir().join(format!("ringlock-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pw");
        std::fs::write(&file, "from file\r\n").unwrap();
        let f = file.to_str().unwrap();
        let from_file = a
            .clone()
            .with_password_from_env(env_of(&[(PASSWORD_FILE_ENV, f), (PASSWORD_ENV, "")]))
            .unwrap();
        assert_eq!(from_file.password.as_deref(), Some("from file"));

        let twice = a
            .clone()
            .with_password_from_env(env_of(&[(PASSWORD_FILE_ENV, f), (PASSWORD_ENV, "x")]))
            .unwrap_err();
        assert!(matches!(twice, AddrError::PasswordTwice(_)), "{twice}");
        let in_url = MysqlAddr::parse("mysql://u:p@h")
            .unwrap()
            .with_password_from_env(env_of(&[(PASSWORD_ENV, "x")]))
            .unwrap_err();
        assert!(in_url.to_string().contains("in the address"), "{in_url}");

        let missing = a
            .with_password_from_env(env_of(&[(PASSWORD_FILE_ENV, "/nonexistent/pw")]))
            .unwrap_err();
        assert!(missing.to_string().contains("/nonexistent/pw"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
