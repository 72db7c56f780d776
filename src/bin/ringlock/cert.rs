//! `ringlock cert`: the CA, node and client certificates of mutual TLS
//! (docs/security.md, "Certificates").
//!
//! ```text
//! ringlock cert create-ca     --certs-dir DIR --ca-key CAKEY            # DIR/ca.crt, CAKEY (0600)
//! ringlock cert create-node   --certs-dir DIR --ca-key CAKEY --node-id N HOST [HOST...]
//! ringlock cert create-client --certs-dir DIR --ca-key CAKEY NAME       # DIR/client.NAME.crt/.key
//! ringlock cert list          --certs-dir DIR                           # subject, identity, expiry
//! ```
//!
//! The certificates themselves are made by `ringlock::tls::gen`, the code
//! the library's tests use; this file checks arguments, reads the CA and
//! writes files.
//!
//! - **Everything is checked before anything is written**: the arguments,
//!   the CA (its key must be the key of a CA certificate in `DIR/ca.crt`),
//!   and that no target exists (unless `--overwrite`).
//! - **A key is never readable by others, nor half-written.** Each file is
//!   written in full under a temporary name in its own directory, created
//!   with its final mode (0600 for keys, 0644 for certificates), synced,
//!   then moved into place: `link(2)` without `--overwrite` (it refuses a
//!   target that appeared meanwhile), `rename(2)` with it.
//! - **What was written loads.** create-node and create-client finish by
//!   loading the new files as the server and client will
//!   (`NodeTls::load`, `ClientTls::load`).

use std::fs::{self, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use clap::Subcommand;
use ringlock::tls::gen::{self, Issuer, Validity};
use ringlock::tls::{self, ClientTls, NodeTls, CA_FILE, NODE_CERT_FILE, NODE_KEY_FILE};

use crate::exit::{Fail, EX_IOERR, EX_SOFTWARE, EX_USAGE};

/// The CA certificate or key is unusable (not a key, the key of another
/// CA, an expired CA).
const EX_DATAERR: u8 = 65;
/// A file needed (ca.crt, the CA key, the certs dir) does not exist or
/// cannot be read.
const EX_NOINPUT: u8 = 66;
/// A file to write exists (and no `--overwrite`) or cannot be created.
const EX_CANTCREAT: u8 = 73;

/// `cert list` marks certificates expiring sooner than this.
const EXPIRING_SOON: Duration = Duration::from_secs(30 * 86_400);

const EXIT_STATUS: &str = "\
Exit status:
  0   done
  64  usage error: bad NAME, node id, HOST or --days (nothing was written)
  65  the CA is unusable: CAKEY is not the key of any CA certificate in DIR/ca.crt,
      or that CA has expired
  66  DIR/ca.crt, CAKEY or DIR does not exist or cannot be read
  70  internal error (a certificate just written does not load)
  73  a file to write exists (use --overwrite) or cannot be created (nothing was written)
  74  i/o error while writing

Files: DIR/ca.crt (the CA certificates; a bundle while a CA is rotated), DIR/node.crt and
DIR/node.key, DIR/client.NAME.crt and DIR/client.NAME.key; keys are mode 0600. CAKEY is
needed only to issue certificates: keep it off the nodes. Identities: ringlock://node/<id>,
ringlock://client/<name> (NAME: 1 to 64 of A-Z a-z 0-9 . _ -). Lifetimes: CA 10 years,
node and client 5 years (never past the CA's); --days shortens them.";

#[derive(Subcommand, Debug)]
#[command(after_long_help = EXIT_STATUS)]
pub enum CertCmd {
    /// Make a new CA: DIR/ca.crt and its private key CAKEY (valid 10 years)
    ///
    /// Copy DIR/ca.crt to every node and client; keep CAKEY somewhere safe,
    /// off the nodes (it is needed again only to issue certificates). To
    /// rotate the CA, make the new one in another directory and append its
    /// ca.crt to every existing one (docs/security.md).
    CreateCa {
        #[command(flatten)]
        issue: Issue,
    },
    /// Issue node N's certificate: DIR/node.crt and DIR/node.key (valid 5 years)
    ///
    /// Needs DIR/ca.crt (copy it in first) and CAKEY. The certificate names
    /// ringlock://node/N and each HOST (as a DNS or IP name, so a client
    /// dialling HOST can check it); it serves the node's lock, admin and
    /// peer ports and authenticates the node when it dials its peers.
    CreateNode {
        #[command(flatten)]
        issue: Issue,
        /// The node's --node-id (1 or more)
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        node_id: u64,
        /// The names clients dial the node by: DNS names or IP addresses
        #[arg(value_name = "HOST", required = true, num_args = 1..)]
        hosts: Vec<String>,
    },
    /// Issue client NAME's certificate: DIR/client.NAME.crt and .key (valid 5 years)
    ///
    /// Needs DIR/ca.crt and CAKEY. The certificate names
    /// ringlock://client/NAME and is good for client authentication only
    /// (never accepted as a node's).
    CreateClient {
        #[command(flatten)]
        issue: Issue,
        /// The client's name: 1 to 64 of A-Z a-z 0-9 . _ -
        #[arg(value_name = "NAME")]
        name: String,
    },
    /// List the certificates in DIR: file, subject, identity, issuer, expiry (EXPIRED, or expiring within 30 days)
    ///
    /// ISSUER is the certificate of ca.crt that issued it (ca.crt#N in a
    /// bundle; "self" for a CA; "not in ca.crt" when none there did): after
    /// a CA rotation, no certificate may still name the old CA when it is
    /// removed from ca.crt.
    List {
        /// The certs dir
        #[arg(long, value_name = "DIR")]
        certs_dir: PathBuf,
    },
}

/// What every create command takes.
#[derive(clap::Args, Debug)]
pub struct Issue {
    /// The certs dir: ca.crt, and the certificates and keys made here
    #[arg(long, value_name = "DIR")]
    certs_dir: PathBuf,
    /// The CA's private key: create-ca writes it (mode 0600), the others read it
    #[arg(long, value_name = "CAKEY")]
    ca_key: PathBuf,
    /// Shorten the lifetime to N days (at most the default: CA 3650, node and client 1826)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    days: Option<u32>,
    /// Replace files that exist (without it, an existing file is an error and nothing is written)
    #[arg(long)]
    overwrite: bool,
}

pub fn run(cmd: &CertCmd) -> Result<u8, Fail> {
    match cmd {
        CertCmd::CreateCa { issue } => create_ca(issue),
        CertCmd::CreateNode {
            issue,
            node_id,
            hosts,
        } => create_node(issue, *node_id, hosts),
        CertCmd::CreateClient { issue, name } => create_client(issue, name),
        CertCmd::List { certs_dir } => list(certs_dir),
    }
}

fn usage(msg: impl std::fmt::Display) -> Fail {
    Fail(EX_USAGE, format!("{msg} (see ringlock cert --help)"))
}

/// The lifetime asked for: the default, or shorter.
fn validity(issue: &Issue, default: u32, what: &str) -> Result<Validity, Fail> {
    match issue.days {
        None => Ok(Validity::days(default)),
        Some(days) if days <= default => Ok(Validity::days(days)),
        Some(days) => Err(usage(format!(
            "--days {days}: {what} live at most {default} days (--days only shortens)"
        ))),
    }
}

fn create_ca(issue: &Issue) -> Result<u8, Fail> {
    let validity = validity(issue, gen::CA_DAYS, "CAs")?;
    let ca_crt = issue.certs_dir.join(CA_FILE);
    refuse_existing(&[&ca_crt, &issue.ca_key], issue.overwrite)?;
    make_dir(&issue.certs_dir, 0o755)?;
    if let Some(parent) = issue.ca_key.parent().filter(|p| !p.as_os_str().is_empty()) {
        // The key's own directory, if new, is private too.
        make_dir(parent, 0o700)?;
    }
    if same_file(&ca_crt, &issue.ca_key) {
        return Err(usage(format!(
            "--ca-key {} is DIR/ca.crt itself",
            issue.ca_key.display()
        )));
    }
    let ca = gen::ca(validity).map_err(|e| Fail(EX_SOFTWARE, e))?;
    write_files(
        &[
            Out::cert(&ca_crt, &ca.cert_pem),
            Out::key(&issue.ca_key, &ca.key_pem),
        ],
        issue.overwrite,
    )?;
    say(&format!(
        "wrote {}: the CA certificate (ringlock CA, valid until {}); copy it into every node's \
         and client's certs dir",
        ca_crt.display(),
        utc(ca.not_after)
    ));
    say(&format!(
        "wrote {}: the CA's private key (mode 0600); it issues every certificate: keep it off \
         the nodes",
        issue.ca_key.display()
    ));
    if in_dir(&issue.certs_dir, &issue.ca_key) {
        note(&format!(
            "the CA key is in the certs dir {}: move it elsewhere before copying the dir to a node",
            issue.certs_dir.display()
        ));
    }
    Ok(0)
}

fn create_node(issue: &Issue, node: u64, hosts: &[String]) -> Result<u8, Fail> {
    let validity = validity(issue, gen::NODE_DAYS, "node certificates")?;
    for host in hosts {
        gen::check_host(host).map_err(usage)?;
    }
    let cert = issue.certs_dir.join(NODE_CERT_FILE);
    let key = issue.certs_dir.join(NODE_KEY_FILE);
    refuse_existing(&[&cert, &key], issue.overwrite)?;
    let issuer = issuer(issue)?;
    let made = issuer
        .node(node, hosts, validity)
        .map_err(|e| Fail(EX_SOFTWARE, e))?;
    write_files(
        &[
            Out::cert(&cert, &made.cert_pem),
            Out::key(&key, &made.key_pem),
        ],
        issue.overwrite,
    )?;
    NodeTls::load(&issue.certs_dir, Some(node)).map_err(|e| {
        Fail(
            EX_SOFTWARE,
            format!("the node certificate just written does not load: {e}"),
        )
    })?;
    say(&format!(
        "wrote {}: node {node} ({}), valid until {}",
        cert.display(),
        hosts.join(", "),
        utc(made.not_after)
    ));
    say(&format!(
        "wrote {}: its private key (mode 0600)",
        key.display()
    ));
    Ok(0)
}

fn create_client(issue: &Issue, name: &str) -> Result<u8, Fail> {
    let validity = validity(issue, gen::CLIENT_DAYS, "client certificates")?;
    tls::check_client_name(name).map_err(usage)?;
    let cert = issue.certs_dir.join(tls::client_cert_file(name));
    let key = issue.certs_dir.join(tls::client_key_file(name));
    refuse_existing(&[&cert, &key], issue.overwrite)?;
    let issuer = issuer(issue)?;
    let made = issuer
        .client(name, validity)
        .map_err(|e| Fail(EX_SOFTWARE, e))?;
    write_files(
        &[
            Out::cert(&cert, &made.cert_pem),
            Out::key(&key, &made.key_pem),
        ],
        issue.overwrite,
    )?;
    ClientTls::load(&issue.certs_dir, Some(name)).map_err(|e| {
        Fail(
            EX_SOFTWARE,
            format!("the client certificate just written does not load: {e}"),
        )
    })?;
    say(&format!(
        "wrote {}: client {name}, valid until {}",
        cert.display(),
        utc(made.not_after)
    ));
    say(&format!(
        "wrote {}: its private key (mode 0600)",
        key.display()
    ));
    Ok(0)
}

/// The CA that issues: the certificate of DIR/ca.crt whose key is CAKEY.
fn issuer(issue: &Issue) -> Result<Issuer, Fail> {
    let ca_crt = issue.certs_dir.join(CA_FILE);
    let ca_pem = read_input(
        &ca_crt,
        "the CA certificate must be in the certs dir: copy in the ca.crt that create-ca wrote",
    )?;
    let key_pem = read_input(&issue.ca_key, "give the CA key that create-ca wrote")?;
    Issuer::from_pem(
        &ca_crt.display().to_string(),
        &ca_pem,
        &issue.ca_key.display().to_string(),
        &key_pem,
    )
    .map_err(|e| Fail(EX_DATAERR, e))
}

fn read_input(path: &Path, if_missing: &str) -> Result<Vec<u8>, Fail> {
    fs::read(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => Fail(
            EX_NOINPUT,
            format!("{}: no such file; {if_missing}", path.display()),
        ),
        _ => Fail(EX_NOINPUT, format!("{}: cannot read: {e}", path.display())),
    })
}

fn list(certs_dir: &Path) -> Result<u8, Fail> {
    let certs = tls::list(certs_dir).map_err(|e| {
        let code = if certs_dir.is_dir() {
            EX_DATAERR
        } else {
            EX_NOINPUT
        };
        Fail(code, e)
    })?;
    if certs.is_empty() {
        note(&format!(
            "no certificates (*.crt) in {}",
            certs_dir.display()
        ));
        return Ok(0);
    }
    let now = SystemTime::now();
    let mut rows = vec![[
        "FILE".to_string(),
        "SUBJECT".into(),
        "IDENTITY".into(),
        "ISSUER".into(),
        "NOT AFTER (UTC)".into(),
        "STATUS".into(),
    ]];
    // How ca.crt's certificates are named in the FILE column.
    let ca_count = certs
        .iter()
        .find(|c| c.path.file_name().is_some_and(|f| f == tls::CA_FILE))
        .map_or(0, |c| c.count);
    for c in &certs {
        let in_ca_crt = c.path.file_name().is_some_and(|f| f == tls::CA_FILE);
        let issuer = match c.issued_by {
            Some(i) if in_ca_crt && i == c.index => "self".to_string(),
            Some(_) if ca_count == 1 => tls::CA_FILE.to_string(),
            Some(i) => format!("{}#{}", tls::CA_FILE, i + 1),
            None => "not in ca.crt".to_string(),
        };
        let mut file = c
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        if c.count > 1 {
            file = format!("{file}#{}", c.index + 1);
        }
        let identity = match (&c.identity, c.is_ca) {
            (_, true) => "CA".to_string(),
            (Ok(id), false) => id.to_string(),
            (Err(e), false) => format!("none: {e}"),
        };
        let status = if now > c.not_after {
            "EXPIRED".to_string()
        } else if now < c.not_before {
            format!("not valid before {}", utc(c.not_before))
        } else {
            let left = c.not_after.duration_since(now).unwrap_or_default();
            if left < EXPIRING_SOON {
                format!("expires in {} days", left.as_secs().div_ceil(86_400))
            } else {
                "ok".to_string()
            }
        };
        rows.push([
            file,
            c.subject.clone(),
            identity,
            issuer,
            utc(c.not_after),
            status,
        ]);
    }
    let mut widths = [0; 6];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 < row.len() {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            } else {
                line.push_str(cell);
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    // A closed pipe (`ringlock cert list | head`) is not an error.
    let _ = io::stdout().write_all(text.as_bytes());
    Ok(0)
}

fn utc(t: SystemTime) -> String {
    ringlock::log::format_utc_time(t)
}

fn say(line: &str) {
    let _ = writeln!(io::stdout(), "{line}");
}

fn note(line: &str) {
    let _ = writeln!(io::stderr(), "ringlock: note: {line}");
}

/// A file to write.
struct Out<'a> {
    path: &'a Path,
    data: &'a [u8],
    mode: u32,
}

impl<'a> Out<'a> {
    fn cert(path: &'a Path, pem: &'a str) -> Out<'a> {
        Out {
            path,
            data: pem.as_bytes(),
            mode: 0o644,
        }
    }

    fn key(path: &'a Path, pem: &'a str) -> Out<'a> {
        Out {
            path,
            data: pem.as_bytes(),
            mode: 0o600,
        }
    }
}

/// Without `--overwrite`, any target that exists (a dangling symlink
/// included) stops the command before anything is made.
fn refuse_existing(paths: &[&Path], overwrite: bool) -> Result<(), Fail> {
    if overwrite {
        return Ok(());
    }
    match paths.iter().find(|p| fs::symlink_metadata(p).is_ok()) {
        Some(p) => Err(exists(p)),
        None => Ok(()),
    }
}

fn exists(path: &Path) -> Fail {
    Fail(
        EX_CANTCREAT,
        format!(
            "{} exists; nothing was written (--overwrite replaces it)",
            path.display()
        ),
    )
}

fn make_dir(dir: &Path, mode: u32) -> Result<(), Fail> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| {
            Fail(
                EX_CANTCREAT,
                format!("{}: cannot create the directory: {e}", dir.display()),
            )
        })
}

/// Writes every file under a temporary name, then moves them all into
/// place; if one cannot be placed (without `--overwrite`), the ones placed
/// before it are removed again, so either all appear or none.
fn write_files(outs: &[Out], overwrite: bool) -> Result<(), Fail> {
    let mut temps = Vec::new();
    let result = (|| {
        for out in outs {
            temps.push(write_temp(out)?);
        }
        let mut placed: Vec<&Path> = Vec::new();
        for (out, temp) in outs.iter().zip(&temps) {
            if let Err(fail) = place(temp, out.path, overwrite) {
                if !overwrite {
                    // Each was created by this run's link(2) just now.
                    for p in placed {
                        let _ = fs::remove_file(p);
                    }
                }
                return Err(fail);
            }
            placed.push(out.path);
        }
        for out in outs {
            sync_dir(out.path)?;
        }
        Ok(())
    })();
    // A linked file keeps its data under the target name; a renamed one has
    // no temporary name left.
    for temp in &temps {
        let _ = fs::remove_file(temp);
    }
    result
}

/// `.NAME.PID.tmp` beside the target, created with the target's mode,
/// written in full and synced.
fn write_temp(out: &Out) -> Result<PathBuf, Fail> {
    let name = out
        .path
        .file_name()
        .ok_or_else(|| usage(format!("{}: not a file name", out.path.display())))?;
    let temp = out.path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    // Left by an earlier run that had this pid and was killed.
    let _ = fs::remove_file(&temp);
    let cannot = |e: io::Error| {
        Fail(
            EX_CANTCREAT,
            format!("{}: cannot create: {e}", temp.display()),
        )
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(out.mode)
        .open(&temp)
        .map_err(cannot)?;
    let written = (|| {
        // The umask may have taken bits off; the mode is exact whatever it is.
        file.set_permissions(Permissions::from_mode(out.mode))?;
        file.write_all(out.data)?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&temp);
        return Err(Fail(EX_IOERR, format!("{}: writing: {e}", temp.display())));
    }
    Ok(temp)
}

fn place(temp: &Path, target: &Path, overwrite: bool) -> Result<(), Fail> {
    let placed = if overwrite {
        fs::rename(temp, target)
    } else {
        // Unlike rename(2), link(2) refuses a target that exists, so a file
        // that appeared since the check is not replaced.
        fs::hard_link(temp, target)
    };
    placed.map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => exists(target),
        _ => Fail(
            EX_CANTCREAT,
            format!("{}: cannot create: {e}", target.display()),
        ),
    })
}

/// Makes the new directory entry durable.
fn sync_dir(file: &Path) -> Result<(), Fail> {
    let dir = dir_of(file);
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Fail(EX_IOERR, format!("{}: syncing: {e}", dir.display())))
}

/// The directory a file path is in (`.` for a bare name).
fn dir_of(file: &Path) -> &Path {
    match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Whether `file` sits directly in `dir` (compared by real paths; false
/// when either cannot be resolved).
fn in_dir(dir: &Path, file: &Path) -> bool {
    match (fs::canonicalize(dir), fs::canonicalize(dir_of(file))) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Whether two paths name the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    a.file_name() == b.file_name() && in_dir(dir_of(a), b)
}
