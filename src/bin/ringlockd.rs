//! `ringlockd`: the lock server.
//!
//! Flags are clap's ([`Args`]). Each setting comes from, first found: its
//! flag, its environment variable `RINGLOCK_<FLAG>` (attached to every
//! flag by [`command`]), its key in the `--config` TOML file
//! ([`file_args`]), its default ([`Config::new`]). The file's values are
//! checked by the flag's own value parser, one key at a time, so that a
//! refusal names the file and line; the values that no flag or variable
//! overrides are then parsed together with the command line, as if given
//! there. The deprecated spellings (`--keepalive-ms` and the other
//! millisecond flags, `BIND_ADDRESS`, `DATA_PATH`) are folded in by
//! [`resolve`] and warned about once the log level is set. Every refusal
//! is one line on stderr and exit 64.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};
use ringlock::config::{self, file, format_ms, format_us, Config, LcAdminActions};
use ringlock::driver::Server;
use ringlock::log::{self, Level};
use ringlock::metrics::{self, Metrics};

#[path = "ringlockd/args.rs"]
mod args;
use args::*;

const EX_USAGE: u8 = 64;

// ---- the command: flags, variables, file

/// `RINGLOCK_` and the flag's name in capitals, `-` as `_`.
fn env_name(long: &str) -> String {
    format!("RINGLOCK_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// A flag with a `RINGLOCK_` variable: not hidden (deprecated), not one
/// of [`COMMAND_LINE_ONLY`] but `--config` (`RINGLOCK_CONFIG`).
fn has_env(a: &Arg) -> bool {
    a.get_long().is_some_and(|l| {
        l == "config" || (l != "version" && !COMMAND_LINE_ONLY.iter().any(|(c, _)| *c == l))
    }) && !a.is_hide_set()
}

/// A setting: a flag with a variable and a file key.
fn is_setting(a: &Arg) -> bool {
    has_env(a) && a.get_long() != Some("config")
}

/// The flags alone: no environment variables (the file's values are
/// checked with it, so that a variable cannot fail in their place).
fn base_command() -> Command {
    Args::command().mut_args(|a| {
        if a.get_action().takes_values() {
            // `--wal-preallocate-bytes -1` is a value to refuse, not a flag.
            a.allow_hyphen_values(true)
        } else {
            a
        }
    })
}

/// [`base_command`] with every setting's `RINGLOCK_<FLAG>` variable. A
/// variable set to the empty string counts as unset.
fn command() -> Command {
    base_command().mut_args(|a| {
        if !has_env(&a) {
            return a;
        }
        let name = env_name(a.get_long().unwrap_or_default());
        if std::env::var_os(&name).is_some_and(|v| v.is_empty()) {
            return a;
        }
        a.env(name).hide_env_values(true)
    })
}

/// What a file value must be, by its flag.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Switch,
    Integer,
    Duration,
    Text,
}

fn kind(a: &Arg) -> Kind {
    let name = a
        .get_value_names()
        .and_then(|n| n.first())
        .map(|n| n.as_str());
    match (a.get_action(), name) {
        (ArgAction::SetTrue, _) => Kind::Switch,
        (_, Some("N" | "OFFSET")) => Kind::Integer,
        (_, Some("D")) => Kind::Duration,
        _ => Kind::Text,
    }
}

/// The setting a file key names, or why there is none.
fn file_key<'a>(cmd: &'a Command, key: &str) -> Result<&'a Arg, String> {
    if let Some(a) = cmd
        .get_arguments()
        .find(|a| a.get_long() == Some(key) && is_setting(a))
    {
        return Ok(a);
    }
    if let Some((_, why)) = COMMAND_LINE_ONLY.iter().find(|(c, _)| *c == key) {
        return Err(format!("{key} is not a config key: {why}"));
    }
    let id = key.replace('-', "_");
    if let Some((_, new, micro)) = DEPRECATED.iter().find(|(old, _, _)| *old == id) {
        return Err(format!(
            "{key} is not a config key: write {} = \"{}\" (a duration with its unit)",
            new.replace('_', "-"),
            if *micro { "50us" } else { "10s" }
        ));
    }
    let kebab = key.replace('_', "-");
    if kebab != key && file_key(cmd, &kebab).is_ok() {
        return Err(format!(
            "unknown key {key:?}: keys are spelled as the flags, {kebab}"
        ));
    }
    let near = cmd
        .get_arguments()
        .filter(|a| is_setting(a))
        .filter_map(|a| a.get_long())
        .map(|l| (edit_distance(key, l), l))
        .filter(|&(d, _)| d <= 2)
        .min();
    Err(match near {
        Some((_, l)) => format!("unknown key {key:?} (did you mean {l}?)"),
        None => format!("unknown key {key:?}"),
    })
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

/// The deprecated environment variables: read when no flag, `RINGLOCK_`
/// variable (and for a file key, no file) gives the setting.
struct Legacy {
    bind: Option<String>,
    data_path: Option<OsString>,
}

impl Legacy {
    fn read() -> Legacy {
        Legacy {
            bind: std::env::var("BIND_ADDRESS").ok().filter(|s| !s.is_empty()),
            data_path: std::env::var_os("DATA_PATH").filter(|s| !s.is_empty()),
        }
    }
}

/// Whether the flags or the variables (current or deprecated) give the
/// setting `id`, so that the file's value is not used.
fn given_above_file(m: &ArgMatches, id: &str, legacy: &Legacy) -> bool {
    let given = |id: &str| {
        matches!(
            m.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    };
    given(id)
        || DEPRECATED
            .iter()
            .any(|(old, new, _)| *new == id && given(old))
        || (id == "bind" && legacy.bind.is_some())
        || (id == "data_path" && legacy.data_path.is_some())
}

/// The `--config` file's settings as command-line arguments (`--key=value`,
/// `--switch`), each checked by its flag's value parser; those the flags
/// or variables give are left out.
fn file_args(
    path: &std::path::Path,
    m: &ArgMatches,
    legacy: &Legacy,
) -> Result<Vec<OsString>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let entries =
        file::parse(&text).map_err(|e| format!("{}:{}: {}", path.display(), e.line, e.message))?;
    let base = base_command();
    let mut out = Vec::new();
    for e in entries {
        let at = format!("{}:{}", path.display(), e.line);
        if e.value == file::Value::Other("table") && file_key(&base, &e.key).is_err() {
            return Err(format!(
                "{at}: [{}] or {0}.KEY: the file has no sections, write each key at the top",
                e.key
            ));
        }
        let arg = file_key(&base, &e.key).map_err(|why| format!("{at}: {why}"))?;
        let long = arg.get_long().unwrap_or_default();
        let token = match (kind(arg), &e.value) {
            (Kind::Switch, file::Value::Bool(true)) => format!("--{long}"),
            (Kind::Switch, file::Value::Bool(false)) => continue,
            (Kind::Integer, file::Value::Int(n)) => format!("--{long}={n}"),
            (Kind::Duration | Kind::Text, file::Value::Str(s)) => format!("--{long}={s}"),
            (k, v) => {
                let expected = match k {
                    Kind::Switch => "true or false",
                    Kind::Integer => "an integer",
                    Kind::Duration => "a string with a unit, such as \"10s\"",
                    Kind::Text => "a string",
                };
                let t = v.type_name();
                let article = if t.starts_with(['a', 'i']) { "an" } else { "a" };
                return Err(format!(
                    "{at}: {long}: expected {expected}, not {article} {t}"
                ));
            }
        };
        if let Err(err) = base.clone().try_get_matches_from(["ringlockd", &token]) {
            return Err(format!("{at}: {long}: {}", value_error(&err)));
        }
        if !given_above_file(m, arg.get_id().as_str(), legacy) {
            out.push(token.into());
        }
    }
    Ok(out)
}

/// A value parser's own message, or clap's on one line.
fn value_error(e: &clap::Error) -> String {
    match std::error::Error::source(e) {
        Some(why) => why.to_string(),
        None => one_line(e),
    }
}

/// clap's message on one line, without its usage and hints.
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    let head = text.split("\n\nUsage:").next().unwrap_or(text);
    head.lines()
        .filter(|l| !l.starts_with("For more information"))
        .flat_map(str::split_whitespace)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A clap refusal as `ringlockd`'s one line: a bad value is named by the
/// flag, or by the variable it came from when no flag gave it.
fn clap_message(e: &clap::Error, cmd: &Command, argv: &[OsString]) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let context = |k| match e.get(k) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    match e.kind() {
        ErrorKind::ValueValidation | ErrorKind::InvalidValue => {
            let Some(why) = std::error::Error::source(e) else {
                return one_line(e);
            };
            let arg = context(ContextKind::InvalidArg).unwrap_or_default();
            let flag = arg.split([' ', '=']).next().unwrap_or_default();
            let on_command_line = argv.iter().skip(1).any(|a| {
                a.to_str()
                    .is_some_and(|a| a == flag || a.starts_with(&format!("{flag}=")))
            });
            let var = cmd
                .get_arguments()
                .find(|a| a.get_long() == flag.strip_prefix("--"))
                .and_then(|a| a.get_env())
                .filter(|v| std::env::var_os(v).is_some());
            match var {
                Some(var) if !on_command_line => format!("{}: {why}", var.to_string_lossy()),
                _ => format!("{flag}: {why}"),
            }
        }
        ErrorKind::UnknownArgument => {
            let arg = context(ContextKind::InvalidArg).unwrap_or_default();
            let tip = context(ContextKind::SuggestedArg)
                .map(|s| format!(" (did you mean {s}?)"))
                .unwrap_or_default();
            if arg.starts_with('-') {
                format!("unknown option {arg}{tip}")
            } else {
                format!("unexpected argument {arg:?}")
            }
        }
        _ => one_line(e),
    }
}

// ---- the settings, resolved

type Cluster = Option<ringlock::cluster::ClusterConfig>;

/// A deprecated spelling that was used, for a warning once the log level
/// is set.
enum Deprecated {
    Flag {
        old: String,
        new: String,
        value: String,
    },
    Env {
        var: &'static str,
        new: &'static str,
        used: bool,
    },
}

struct Settings {
    cfg: Config,
    level: Level,
    cluster: Cluster,
    check_only: bool,
    deprecated: Vec<Deprecated>,
    /// For `--check-config`'s listing.
    auth_token_file: Option<PathBuf>,
    peers: Option<String>,
    force_new: bool,
}

/// The settings from `argv`, the environment and the `--config` file;
/// `None` after `--help` or `--version` (printed).
fn parse(argv: Vec<OsString>) -> Result<Option<Settings>, String> {
    let cmd = command();
    let first = match cmd.clone().try_get_matches_from(&argv) {
        Ok(m) => m,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return Ok(None);
            }
            return Err(clap_message(&e, &cmd, &argv));
        }
    };
    let legacy = Legacy::read();
    let mut all = argv.clone();
    if let Some(path) = first.get_one::<PathBuf>("config") {
        all.extend(file_args(path, &first, &legacy)?);
    }
    let m = cmd
        .clone()
        .try_get_matches_from(&all)
        .map_err(|e| clap_message(&e, &cmd, &all))?;
    let args = Args::from_arg_matches(&m).map_err(|e| clap_message(&e, &cmd, &all))?;
    resolve(args, &first, legacy).map(Some)
}

/// The deprecated flags folded into their replacements, the deprecated
/// variables under everything else, the defaults, and the checks that
/// involve more than one setting.
fn resolve(mut a: Args, first: &ArgMatches, legacy: Legacy) -> Result<Settings, String> {
    let mut deprecated = fold_deprecated_flags(&mut a, first)?;
    fold_legacy_env(&mut a, &legacy, &mut deprecated)?;
    let mut cfg = base_config(&a)?;
    apply_limits(&mut cfg, &a)?;
    let cluster = cluster_config(&a, &cfg)?;
    apply_tls(&mut cfg, &a, cluster.is_some())?;
    let (join, force_new) = (a.join, a.force_new_cluster);
    if cluster.is_none() && (join || a.raft_compact_entries.is_some()) {
        return Err(format!(
            "{} is a cluster flag: it needs --node-id and --peers",
            if join {
                "--join"
            } else {
                "--raft-compact-entries"
            }
        ));
    }
    Ok(Settings {
        cfg,
        level: a.log_level.unwrap_or(Level::Info),
        cluster,
        check_only: a.check_config,
        deprecated,
        auth_token_file: a.auth_token_file,
        peers: a.peers,
        force_new,
    })
}

/// Each deprecated flag given (`--keepalive-ms`, ...) folded into its
/// replacement, refused if that is on the command line too; the list of
/// them, for the warnings.
fn fold_deprecated_flags(a: &mut Args, first: &ArgMatches) -> Result<Vec<Deprecated>, String> {
    let mut deprecated = Vec::new();
    {
        let mut fold = |new: &mut Option<u64>, old: Option<u64>, old_id: &str| {
            let Some(v) = old else { return Ok(()) };
            let (_, new_id, micro) = DEPRECATED
                .iter()
                .find(|(o, _, _)| *o == old_id)
                .expect("a deprecated flag");
            let (old_flag, new_flag) = (old_id.replace('_', "-"), new_id.replace('_', "-"));
            if first.value_source(new_id) == Some(ValueSource::CommandLine) {
                return Err(format!(
                    "--{old_flag} and --{new_flag} both given: keep --{new_flag} \
                     (--{old_flag} is deprecated)"
                ));
            }
            let v = match *new_id {
                "keepalive" | "min_keepalive" | "max_keepalive" | "min_ttl" | "max_ttl" => {
                    if v > u64::from(u32::MAX) {
                        return Err(format!("--{old_flag}: at most {}", u32::MAX - 1));
                    }
                    v.min(KEEPALIVE_MAX_MS)
                }
                _ => v,
            };
            *new = Some(v);
            deprecated.push(Deprecated::Flag {
                value: if *micro { format_us(v) } else { format_ms(v) },
                old: old_flag,
                new: new_flag,
            });
            Ok::<(), String>(())
        };
        fold(
            &mut a.liveness_timeout,
            a.liveness_timeout_ms,
            "liveness_timeout_ms",
        )?;
        fold(&mut a.bind_retry, a.bind_retry_ms, "bind_retry_ms")?;
        fold(&mut a.idle_timeout, a.idle_timeout_ms, "idle_timeout_ms")?;
        fold(&mut a.frame_timeout, a.frame_timeout_ms, "frame_timeout_ms")?;
        fold(&mut a.idle_poll, a.idle_poll_us, "idle_poll_us")?;
        fold(&mut a.keepalive, a.keepalive_ms, "keepalive_ms")?;
        fold(&mut a.min_keepalive, a.min_keepalive_ms, "min_keepalive_ms")?;
        fold(&mut a.max_keepalive, a.max_keepalive_ms, "max_keepalive_ms")?;
        fold(&mut a.min_ttl, a.min_ttl_ms, "min_ttl_ms")?;
        fold(&mut a.max_ttl, a.max_ttl_ms, "max_ttl_ms")?;
    }
    Ok(deprecated)
}

/// The deprecated variables `BIND_ADDRESS` and `DATA_PATH`, under every
/// other source of their settings.
fn fold_legacy_env(
    a: &mut Args,
    legacy: &Legacy,
    deprecated: &mut Vec<Deprecated>,
) -> Result<(), String> {
    if let Some(s) = &legacy.bind {
        deprecated.push(Deprecated::Env {
            var: "BIND_ADDRESS",
            new: "RINGLOCK_BIND",
            used: a.bind.is_none(),
        });
        if a.bind.is_none() {
            a.bind = Some(config::parse_addr(s).map_err(|e| format!("BIND_ADDRESS: {e}"))?);
        }
    }
    if let Some(p) = &legacy.data_path {
        deprecated.push(Deprecated::Env {
            var: "DATA_PATH",
            new: "RINGLOCK_DATA_PATH",
            used: a.data_path.is_none(),
        });
        if a.data_path.is_none() {
            a.data_path = Some(p.into());
        }
    }
    Ok(())
}

/// The configuration's addresses, files and switches from `a`, over
/// `Config`'s defaults.
fn base_config(a: &Args) -> Result<Config, String> {
    let mut cfg = Config::new(a.bind.unwrap_or(Config::default().bind));
    if let Some(p) = &a.auth_token_file {
        cfg.auth_token = Some(config::read_auth_token(p)?);
    }
    if let Some(p) = a.lc_admin_actions {
        cfg.lc_admin_actions = p;
    }
    cfg.threads = a
        .threads
        .unwrap_or_else(|| ringlock::driver::allowed_cpus().len());
    if let Some(v) = a.admin_bind {
        cfg.admin_bind = v;
    }
    cfg.metrics_bind = a.metrics_bind;
    cfg.data_path = a.data_path.clone();
    cfg.wal_truncate_at = a.wal_truncate_at;
    cfg.faults = std::env::var("RINGLOCK_FAULTS")
        .ok()
        .filter(|s| !s.is_empty());
    if cfg.wal_truncate_at.is_some() && cfg.data_path.is_none() {
        return Err("--wal-truncate-at needs --data-path".into());
    }
    Ok(cfg)
}

/// The timeouts, sizes and bounds from `a`, and the checks between them.
fn apply_limits(cfg: &mut Config, a: &Args) -> Result<(), String> {
    let set = |field: &mut u64, v: Option<u64>| {
        if let Some(v) = v {
            *field = v;
        }
    };
    set(&mut cfg.wal_preallocate_bytes, a.wal_preallocate_bytes);
    set(&mut cfg.compact_floor_bytes, a.compact_floor_bytes);
    set(&mut cfg.bind_retry_ms, a.bind_retry);
    set(&mut cfg.idle_timeout_ms, a.idle_timeout);
    set(&mut cfg.idle_poll_us, a.idle_poll);
    set(&mut cfg.liveness_timeout_ms, a.liveness_timeout);
    set(&mut cfg.frame_timeout_ms, a.frame_timeout);
    let size = |field: &mut usize, v: Option<u64>| {
        if let Some(v) = v {
            *field = usize::try_from(v).unwrap_or(usize::MAX);
        }
    };
    size(&mut cfg.max_connections, a.max_connections);
    size(&mut cfg.admin_connections, a.admin_connections);
    size(&mut cfg.max_keys, a.max_keys);
    size(&mut cfg.max_waiters, a.max_waiters);
    // Bounded by KEEPALIVE_MAX_MS where parsed.
    let ms32 = |field: &mut u32, v: Option<u64>| {
        if let Some(v) = v {
            *field = u32::try_from(v.min(KEEPALIVE_MAX_MS)).unwrap_or(u32::MAX - 1);
        }
    };
    ms32(&mut cfg.keepalive_ms, a.keepalive);
    ms32(&mut cfg.min_keepalive_ms, a.min_keepalive);
    ms32(&mut cfg.max_keepalive_ms, a.max_keepalive);
    ms32(&mut cfg.min_ttl_ms, a.min_ttl);
    ms32(&mut cfg.max_ttl_ms, a.max_ttl);
    let ms = |v: u32| format_ms(u64::from(v));
    if cfg.min_keepalive_ms > cfg.max_keepalive_ms {
        return Err(format!(
            "--min-keepalive {} is above --max-keepalive {}",
            ms(cfg.min_keepalive_ms),
            ms(cfg.max_keepalive_ms)
        ));
    }
    if a.keepalive.is_none() {
        // The default follows bounds that exclude it.
        cfg.keepalive_ms = cfg
            .keepalive_ms
            .clamp(cfg.min_keepalive_ms, cfg.max_keepalive_ms);
    }
    if !(cfg.min_keepalive_ms..=cfg.max_keepalive_ms).contains(&cfg.keepalive_ms) {
        return Err(format!(
            "--keepalive {} must lie within --min-keepalive {} and --max-keepalive {}",
            ms(cfg.keepalive_ms),
            ms(cfg.min_keepalive_ms),
            ms(cfg.max_keepalive_ms)
        ));
    }
    if cfg.min_ttl_ms > cfg.max_ttl_ms {
        return Err(format!(
            "--min-ttl {} is above --max-ttl {}",
            ms(cfg.min_ttl_ms),
            ms(cfg.max_ttl_ms)
        ));
    }
    Ok(())
}

/// `--node-id` and `--peers` with the cluster flags, or `None` for a
/// single node.
fn cluster_config(
    a: &Args,
    cfg: &Config,
) -> Result<Option<ringlock::cluster::ClusterConfig>, String> {
    let (join, force_new, insecure) = (a.join, a.force_new_cluster, a.insecure);
    let cluster = match (a.node_id, &a.peers) {
        (None, None) => None,
        (Some(_), None) => return Err("--node-id needs --peers (the cluster's nodes)".into()),
        (None, Some(_)) => {
            return Err("--peers needs --node-id (which of them this node is)".into())
        }
        (Some(id), Some(peers)) => {
            if cfg.data_path.is_none() {
                return Err(
                    "--peers needs --data-path: a cluster node's votes and log must survive a restart"
                        .into(),
                );
            }
            let mut c = ringlock::cluster::ClusterConfig::parse(id, peers)?;
            c.join = join;
            c.force_new = force_new;
            if join && force_new {
                return Err("--join and --force-new-cluster exclude each other".into());
            }
            if let Some(n) = a.raft_compact_entries {
                c.compact_entries = n;
            }
            if a.certs_dir.is_none() && !insecure {
                return Err(
                    "a cluster node needs certificates: make them with `ringlock cert \
                     create-ca` and `ringlock cert create-node`, then give --certs-dir DIR \
                     (docs/security.md); or give every node --insecure to run the cluster open \
                     to anyone who can reach its Raft ports"
                        .into(),
                );
            }
            Some(c)
        }
    };
    Ok(cluster)
}

/// The certificates and the ports' TLS switches, refused where they
/// contradict each other or need what is not given.
fn apply_tls(cfg: &mut Config, a: &Args, cluster: bool) -> Result<(), String> {
    let insecure = a.insecure;
    if insecure && a.certs_dir.is_some() {
        return Err("--insecure and --certs-dir contradict each other: give one".into());
    }
    if insecure && !cluster {
        return Err(
            "--insecure is for a cluster (--peers) without certificates; a single node \
             runs without them unless given --certs-dir"
                .into(),
        );
    }
    if a.certs_dir.is_none() && (a.client_cert_auth || a.lc_plaintext || a.client_plaintext) {
        return Err(format!(
            "{} needs --certs-dir: without certificates the lock port speaks no TLS",
            if a.client_cert_auth {
                "--client-cert-auth"
            } else if a.lc_plaintext {
                "--lc-plaintext"
            } else {
                "--client-plaintext"
            }
        ));
    }
    if a.client_cert_auth && a.client_plaintext {
        return Err(
            "--client-cert-auth and --client-plaintext contradict each other: a plaintext \
             client presents no certificate"
                .into(),
        );
    }
    cfg.certs_dir = a.certs_dir.clone();
    cfg.insecure = insecure;
    cfg.client_cert_auth = a.client_cert_auth;
    cfg.lc_plaintext = a.lc_plaintext;
    cfg.client_plaintext = a.client_plaintext;
    Ok(())
}

fn warn_deprecated(list: &[Deprecated]) {
    for d in list {
        match d {
            Deprecated::Flag { old, new, value } => ringlock::log!(
                Level::Warn,
                "deprecated_flag",
                "flag=--{old} replacement=\"--{new} {value}\" reason=\"--{old} is deprecated and will be removed: durations are written with their unit\""
            ),
            Deprecated::Env { var, new, used } => ringlock::log!(
                Level::Warn,
                "deprecated_env",
                "var={var} replacement={new} used={used} reason=\"{var} is deprecated and will be removed{}\"",
                if *used { "" } else { "; a flag or the RINGLOCK_ variable overrides it here" }
            ),
        }
    }
}

/// The effective settings as a config file `--config` reads back (what
/// `--check-config` prints).
fn effective(s: &Settings) -> String {
    let c = &s.cfg;
    let q = |p: &std::path::Path| file::quote(&p.to_string_lossy());
    let mut out = String::from(
        "# ringlockd's effective settings (flags > RINGLOCK_* variables > --config file > defaults)\n",
    );
    let mut line = |key: &str, value: Option<String>, unset: &str| {
        let _ = match value {
            Some(v) => writeln!(out, "{key} = {v}"),
            None => writeln!(out, "# {key}: {unset}"),
        };
    };
    let s_ = |v: &dyn std::fmt::Display| Some(file::quote(&v.to_string()));
    let ms = |v: u64| Some(file::quote(&format_ms(v)));
    line("bind", s_(&c.bind), "");
    line("admin-bind", s_(&c.admin_bind), "");
    line("metrics-bind", c.metrics_bind.and_then(|a| s_(&a)), "off");
    line("liveness-timeout", ms(c.liveness_timeout_ms), "");
    line("bind-retry", ms(c.bind_retry_ms), "");
    line(
        "data-path",
        c.data_path.as_deref().map(q),
        "none (in memory)",
    );
    line(
        "compact-floor-bytes",
        Some(c.compact_floor_bytes.to_string()),
        "",
    );
    line(
        "wal-preallocate-bytes",
        Some(c.wal_preallocate_bytes.to_string()),
        "",
    );
    line("max-connections", Some(c.max_connections.to_string()), "");
    line(
        "admin-connections",
        Some(c.admin_connections.to_string()),
        "",
    );
    line("max-keys", Some(c.max_keys.to_string()), "");
    line("max-waiters", Some(c.max_waiters.to_string()), "");
    line("idle-timeout", ms(c.idle_timeout_ms), "");
    line("frame-timeout", ms(c.frame_timeout_ms), "");
    line(
        "idle-poll",
        Some(file::quote(&format_us(c.idle_poll_us))),
        "",
    );
    line("threads", Some(c.threads.to_string()), "");
    line("keepalive", ms(c.keepalive_ms.into()), "");
    line("min-keepalive", ms(c.min_keepalive_ms.into()), "");
    line("max-keepalive", ms(c.max_keepalive_ms.into()), "");
    line("min-ttl", ms(c.min_ttl_ms.into()), "");
    line("max-ttl", ms(c.max_ttl_ms.into()), "");
    line(
        "auth-token-file",
        s.auth_token_file.as_deref().map(q),
        "none",
    );
    let lc = match c.lc_admin_actions {
        LcAdminActions::Any => "any",
        LcAdminActions::Loopback => "loopback",
        LcAdminActions::Off => "off",
    };
    line("lc-admin-actions", s_(&lc), "");
    line("certs-dir", c.certs_dir.as_deref().map(q), "none");
    line("client-cert-auth", Some(c.client_cert_auth.to_string()), "");
    line("lc-plaintext", Some(c.lc_plaintext.to_string()), "");
    line("client-plaintext", Some(c.client_plaintext.to_string()), "");
    line("insecure", Some(c.insecure.to_string()), "");
    let cl = s.cluster.as_ref();
    line(
        "node-id",
        cl.map(|c| c.node_id.to_string()),
        "none (one node)",
    );
    line(
        "peers",
        s.peers.as_ref().and_then(|p| s_(p)),
        "none (one node)",
    );
    line("join", cl.map(|c| c.join.to_string()), "false");
    line(
        "raft-compact-entries",
        cl.map(|c| c.compact_entries.to_string()),
        "(cluster mode only)",
    );
    line("log-level", s_(&s.level.name()), "");
    if let Some(at) = c.wal_truncate_at {
        let _ = writeln!(out, "# command line only: --wal-truncate-at {at}");
    }
    if s.force_new {
        let _ = writeln!(out, "# command line only: --force-new-cluster");
    }
    out
}

fn warn_if_exposed(cfg: &Config) {
    use config::LcAdminActions;
    if !cfg.bind.ip().is_loopback()
        && (cfg.auth_token.is_none() || cfg.lc_admin_actions == LcAdminActions::Any)
    {
        ringlock::log!(
            Level::Warn,
            "insecure_bind",
            "port=lock addr={} auth_token={} lc_admin_actions={:?} reason=\"reachable from other hosts: {}\"",
            cfg.bind,
            cfg.auth_token.is_some(),
            cfg.lc_admin_actions,
            if cfg.lc_admin_actions == LcAdminActions::Any {
                "any client can Unlock or reset any key (see --lc-admin-actions)"
            } else {
                "session clients are not authenticated (see --auth-token-file)"
            }
        );
    }
    if cfg.insecure {
        ringlock::log!(
            Level::Warn,
            "insecure_cluster",
            "reason=\"--insecure: the Raft ports take anyone; a stranger who reaches them can join, stall, read or rewrite the cluster\" action=\"make certificates with ringlock cert and start with --certs-dir\""
        );
    }
    if cfg.client_plaintext {
        ringlock::log!(
            Level::Warn,
            "client_plaintext",
            "port=lock addr={} admin={} reason=\"--client-plaintext: sessions, admin commands and their auth token may travel in clear\"",
            cfg.bind,
            cfg.admin_bind
        );
    } else if cfg.lc_plaintext {
        ringlock::log!(
            Level::Warn,
            "lc_plaintext",
            "port=lock addr={} reason=\"--lc-plaintext: Locking-Center requests travel in clear, unauthenticated; sessions still need TLS\"",
            cfg.bind
        );
    }
    if !cfg.admin_bind.ip().is_loopback() && cfg.auth_token.is_none() && cfg.certs_dir.is_none() {
        ringlock::log!(
            Level::Warn,
            "insecure_bind",
            "port=admin addr={} auth_token=false lc_admin_actions={:?} reason=\"reachable from other hosts without --auth-token-file: anyone can list and reset every key\"",
            cfg.admin_bind,
            cfg.lc_admin_actions
        );
    }
}

fn main() -> ExitCode {
    let settings = match parse(std::env::args_os().collect()) {
        Ok(Some(v)) => v,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringlockd: {e} (see --help)");
            return ExitCode::from(EX_USAGE);
        }
    };
    log::set_level(settings.level);
    warn_deprecated(&settings.deprecated);
    warn_if_exposed(&settings.cfg);
    if settings.check_only {
        print!("{}", effective(&settings));
        return ExitCode::SUCCESS;
    }
    let Settings { cfg, cluster, .. } = settings;
    let m = Arc::new(Metrics::new_loops(cfg.threads));
    let server = match Server::bind_cluster(cfg.clone(), m.clone(), cluster.clone()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ringlockd: {e}");
            return ExitCode::from(1);
        }
    };
    // Only after Server::bind: it blocks SIGINT/SIGTERM for the signalfd, and
    // the HTTP threads must inherit that mask, or a SIGTERM delivered to one
    // of them would kill the process instead of stopping it cleanly.
    let metrics_addr = match cfg.metrics_bind {
        Some(a) => match metrics::serve_with(
            a,
            m.clone(),
            metrics::Options {
                liveness_timeout: std::time::Duration::from_millis(cfg.liveness_timeout_ms),
                ..metrics::Options::default()
            },
        ) {
            Ok(bound) => Some(bound),
            Err(e) => {
                eprintln!("ringlockd: cannot serve metrics on {a}: {e}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let metrics_field = metrics_addr
        .map(|a| format!(" metrics={a}"))
        .unwrap_or_default();
    ringlock::log!(
        Level::Info,
        "listening",
        "lock={} admin={}{} data_path={} max_connections={} shards={} node={} version={}",
        server.lock_addr(),
        server.admin_addr(),
        metrics_field,
        cfg.data_path
            .as_deref()
            .map_or(log::Bytes(b"none"), log::path),
        server.config().max_connections,
        server.config().threads,
        cluster.as_ref().map_or(0, |c| c.node_id),
        env!("CARGO_PKG_VERSION")
    );
    match server.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringlockd: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        command().debug_assert();
    }

    #[test]
    fn every_setting_has_its_variable_and_every_deprecated_flag_its_replacement() {
        let cmd = command();
        for a in cmd.get_arguments().filter(|a| is_setting(a)) {
            let long = a.get_long().unwrap();
            assert_eq!(
                a.get_env().map(|e| e.to_string_lossy().into_owned()),
                Some(env_name(long)),
                "--{long}"
            );
            assert!(file_key(&cmd, long).is_ok(), "--{long} is a file key");
        }
        for (old, new, _) in DEPRECATED {
            let find = |id: &str| cmd.get_arguments().find(|a| a.get_id() == id);
            assert!(
                find(old).is_some_and(|a| a.is_hide_set() && a.get_env().is_none()),
                "{old}"
            );
            assert!(find(new).is_some_and(is_setting), "{new}");
        }
        // (--help is clap's, added when the command is built.)
        for (flag, _) in COMMAND_LINE_ONLY.iter().filter(|(f, _)| *f != "help") {
            let a = cmd.get_arguments().find(|a| a.get_long() == Some(flag));
            assert!(a.is_some_and(|a| !is_setting(a)), "{flag}");
            assert!(file_key(&cmd, flag).is_err(), "{flag}");
        }
        assert_eq!(env_name("auth-token-file"), "RINGLOCK_AUTH_TOKEN_FILE");
    }

    #[test]
    fn file_keys_refused_say_what_to_write() {
        let cmd = base_command();
        let why = |k| file_key(&cmd, k).unwrap_err();
        assert_eq!(
            why("keepalvie"),
            "unknown key \"keepalvie\" (did you mean keepalive?)"
        );
        assert_eq!(why("frobnicate"), "unknown key \"frobnicate\"");
        assert_eq!(
            why("auth_token_file"),
            "unknown key \"auth_token_file\": keys are spelled as the flags, auth-token-file"
        );
        assert_eq!(
            why("keepalive-ms"),
            "keepalive-ms is not a config key: write keepalive = \"10s\" (a duration with its unit)"
        );
        assert!(why("force-new-cluster").contains("command line"));
        assert!(why("config").contains("cannot name another"));
        assert_eq!(edit_distance("keepalive", "keepalive"), 0);
        assert_eq!(edit_distance("max-key", "max-keys"), 1);
        assert_eq!(edit_distance("abc", "cab"), 2);
    }
}
