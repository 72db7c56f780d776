//! The command line's unit tests: clap's definition, durations, key formats.

use std::ffi::OsStr;
use std::time::Duration;

use super::*;
use crate::args::{parse_keepalive, HoldArgs, KeyFormat};
use crate::exit::EX_USAGE;
use crate::show::shell_key;
use ringlock::config::parse_duration;

#[test]
fn clap_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn durations() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
    assert!(parse_duration("").is_err());
    assert!(parse_duration("5x").is_err());
    assert!(parse_duration("-1s").is_err());
}

fn parse(args: &[&str]) -> Result<Cli, u8> {
    let argv = std::iter::once("ringlock").chain(args.iter().copied());
    parse_args(argv.map(OsString::from))
        .map(|(cli, _)| cli)
        .map_err(|Fail(code, _)| code)
}

#[test]
fn parses_commands() {
    let cli = parse(&[
        "--addr",
        "h:1",
        "--source",
        "me",
        "lock",
        "k",
        "--timeout",
        "2s",
        "--",
        "sh",
        "-c",
        "exit 3",
    ])
    .expect("valid");
    assert_eq!(cli.addr, "h:1");
    assert_eq!(cli.source.as_deref(), Some(OsStr::new("me")));
    match cli.cmd {
        Cmd::Lock {
            key,
            timeout,
            hold,
            command,
        } => {
            assert_eq!(key, "k");
            assert_eq!(timeout, Some(Duration::from_secs(2)));
            assert_eq!(command, ["sh", "-c", "exit 3"]);
            assert_eq!(
                hold,
                HoldArgs {
                    ttl: None,
                    persistent: false,
                    shared: false,
                    limit: None,
                    kill_after: Duration::from_secs(10),
                    keepalive: None,
                    ping_timeout: None,
                },
                "a session lock by default"
            );
        }
        other => panic!("lock expected, got {other:?}"),
    }
    assert!(matches!(
        parse(&["reset", "--source", "s"]).ok().map(|c| c.cmd),
        Some(Cmd::Reset {
            by_source: Some(_),
            ..
        })
    ));
    assert!(matches!(
        parse(&["keys", "-d", "--older-than", "5m"]).ok().map(|c| c.cmd),
        Some(Cmd::Keys { dates: true, json: false, older_than: Some(d) }) if d == Duration::from_secs(300)
    ));
    match parse(&[
        "try-lock",
        "--ttl",
        "1.5s",
        "--kill-after",
        "2s",
        "k",
        "--",
        "true",
    ])
    .map(|c| c.cmd)
    {
        Ok(Cmd::TryLock { hold, .. }) => assert_eq!(
            hold,
            HoldArgs {
                ttl: Some(Duration::from_millis(1500)),
                persistent: false,
                shared: false,
                limit: None,
                kill_after: Duration::from_secs(2),
                keepalive: None,
                ping_timeout: None,
            }
        ),
        other => panic!("try-lock expected, got {other:?}"),
    }
    assert!(matches!(
        parse(&["lock", "--persistent", "k", "--", "true"]).map(|c| c.cmd),
        Ok(Cmd::Lock {
            hold: HoldArgs {
                persistent: true,
                ..
            },
            ..
        })
    ));
    for bad in [
        &["lock", "--ttl", "1s", "--persistent", "k", "--", "true"][..],
        &[
            "lock",
            "--persistent",
            "--kill-after",
            "1s",
            "k",
            "--",
            "true",
        ],
        &["lock", "--ttl", "soon", "k", "--", "true"],
        &["lock", "k"],
        &["lock"],
        &["lock", "--", "echo", "hi"],
        &["lock", "k", "echo", "hi"],
        &[],
        &["frob"],
        &["unlock", "a", "b"],
        &["reset"],
        &["reset", "k", "--source", "s"],
        &["keys", "--nope"],
        &["--retry", "soon", "keys"],
        &["completions", "tcsh"],
    ] {
        assert_eq!(parse(bad).err(), Some(EX_USAGE), "{bad:?}");
    }
}

#[test]
fn shared_and_limit() {
    for (args, shared, limit) in [
        (&["lock", "--shared", "k", "--", "true"][..], true, None),
        (
            &["try-lock", "--limit", "3", "k", "--", "true"],
            false,
            Some(3),
        ),
        (
            &["lock", "--ttl", "5s", "--limit", "1", "k", "--", "true"],
            false,
            Some(1),
        ),
    ] {
        match parse(args).map(|c| c.cmd) {
            Ok(Cmd::Lock { hold, .. } | Cmd::TryLock { hold, .. }) => {
                assert_eq!((hold.shared, hold.limit), (shared, limit), "{args:?}");
            }
            other => panic!("{args:?}: lock expected, got {other:?}"),
        }
    }
    for bad in [
        &["lock", "--shared", "--limit", "2", "k", "--", "true"][..],
        &["lock", "--limit", "0", "k", "--", "true"],
        &["lock", "--limit", "-1", "k", "--", "true"],
        &["lock", "--limit", "k", "--", "true"],
        &["lock", "--shared", "--persistent", "k", "--", "true"],
        &[
            "try-lock",
            "--limit",
            "2",
            "--persistent",
            "k",
            "--",
            "true",
        ],
    ] {
        assert_eq!(parse(bad).err(), Some(EX_USAGE), "{bad:?}");
    }
}

#[test]
fn keepalive_and_ping_timeout() {
    match parse(&[
        "lock",
        "--keepalive",
        "250ms",
        "--ping-timeout",
        "1.5",
        "k",
        "--",
        "true",
    ])
    .map(|c| c.cmd)
    {
        Ok(Cmd::Lock { hold, .. }) => {
            assert_eq!(hold.keepalive, Some(Duration::from_millis(250)));
            assert_eq!(hold.ping_timeout, Some(Duration::from_millis(1500)));
        }
        other => panic!("lock expected, got {other:?}"),
    }
    match parse(&[
        "try-lock",
        "--ttl",
        "3s",
        "--keepalive",
        "2s",
        "k",
        "--",
        "true",
    ])
    .map(|c| c.cmd)
    {
        Ok(Cmd::TryLock { hold, .. }) => {
            assert_eq!(hold.keepalive, Some(Duration::from_secs(2)));
            assert_eq!(hold.ping_timeout, None);
        }
        other => panic!("try-lock expected, got {other:?}"),
    }
    assert_eq!(parse_keepalive("1ms"), Ok(Duration::from_millis(1)));
    assert_eq!(
        parse_keepalive("4294967295ms"),
        Ok(Duration::from_millis(u64::from(u32::MAX)))
    );
    assert_eq!(
        parse_keepalive("0"),
        Err("\"0\" is too short (at least 1ms)".into())
    );
    assert_eq!(
        parse_keepalive("0.5ms"),
        Err("\"0.5ms\" is too short (at least 1ms)".into())
    );
    assert!(parse_keepalive("4294967296ms")
        .unwrap_err()
        .contains("is too long (at most 4294967295ms"));
    assert!(parse_keepalive("soon")
        .unwrap_err()
        .contains("bad duration"));
    for bad in [
        &["lock", "--keepalive", "0", "k", "--", "true"][..],
        &["lock", "--ping-timeout", "-1s", "k", "--", "true"],
        &["lock", "--keepalive", "soon", "k", "--", "true"],
        &[
            "lock",
            "--keepalive",
            "1s",
            "--persistent",
            "k",
            "--",
            "true",
        ],
        &[
            "try-lock",
            "--ping-timeout",
            "1s",
            "--persistent",
            "k",
            "--",
            "true",
        ],
    ] {
        assert_eq!(parse(bad).err(), Some(EX_USAGE), "{bad:?}");
    }
}

#[test]
fn key_formats() {
    assert_eq!(
        arg_bytes(OsStr::new("a\\x20b"), KeyFormat::Raw).as_deref(),
        Ok(&b"a\\x20b"[..])
    );
    assert_eq!(
        arg_bytes(OsStr::new("a\\x20b"), KeyFormat::Escaped).as_deref(),
        Ok(&b"a b"[..])
    );
    assert_eq!(
        arg_bytes(OsStr::new("ff00"), KeyFormat::Hex).as_deref(),
        Ok(&b"\xff\x00"[..])
    );
    assert!(arg_bytes(OsStr::new("\\q"), KeyFormat::Escaped).is_err());
    assert!(key_arg(OsStr::new(""), KeyFormat::Raw).is_err());
    assert!(key_arg(OsStr::new(&"k".repeat(128)), KeyFormat::Raw).is_err());
    assert_eq!(shell_key(b"deploy/prod"), "deploy/prod");
    assert_eq!(shell_key(b"a b'c"), "--key-format escaped 'a\\x20b'\\''c'");
}
