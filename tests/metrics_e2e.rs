//! End to end: the real `ringlockd` with `--metrics-bind`, known traffic over
//! raw Locking-Center frames, then every figure of `/metrics` checked against
//! what was done, and the scrape run through `promtool check metrics` (a
//! missing promtool fails the test; CI installs Debian's `prometheus`).

mod common;

use common::{admin_names, frame, keys, Conn, Server};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// One scrape: series (`name{labels}`) → value.
struct Scrape {
    text: String,
    series: BTreeMap<String, f64>,
}

impl Scrape {
    fn get(&self, series: &str) -> f64 {
        *self
            .series
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in scrape:\n{}", self.text))
    }
}

fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to metrics port");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(s, "GET {path} HTTP/1.1\r\nHost: ringlock\r\n\r\n").expect("send request");
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("read answer");
    let status = answer
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn scrape(server: &Server) -> Scrape {
    let addr = server.metrics_addr.expect("metrics= in the listening line");
    let (status, text) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let mut series = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (name, value) = line.rsplit_once(' ').expect("`series value`");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value: {line}"));
        assert!(
            series.insert(name.to_string(), value).is_none(),
            "duplicate series {name}"
        );
    }
    Scrape { text, series }
}

/// Scrapes until `done` holds (the loop publishes gauges once per tick).
fn scrape_until(server: &Server, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = scrape(server);
        if done(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}:\n{}",
            s.text
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn req(action: &str, result: &str) -> String {
    let protocol = if action.starts_with("admin_") {
        "admin"
    } else {
        "lc"
    };
    format!(
        "ringlock_requests_total{{protocol=\"{protocol}\",action=\"{action}\",result=\"{result}\"}}"
    )
}

const HISTOGRAMS: [&str; 4] = [
    "ringlock_queue_wait_seconds",
    "ringlock_hold_seconds",
    "ringlock_wal_fdatasync_seconds",
    "ringlock_wal_batch_records",
];

/// Checks the scrape's every series: those named in `expected` exactly,
/// histogram internals for consistency, and all others to be zero.
fn check_every_figure(s: &Scrape, expected: &BTreeMap<String, f64>) {
    for (name, want) in expected {
        assert_eq!(s.get(name), *want, "{name}\n{}", s.text);
    }
    for h in HISTOGRAMS {
        let buckets: Vec<(f64, f64)> = s
            .series
            .iter()
            .filter_map(|(name, v)| {
                let le = name.strip_prefix(&format!("{h}_bucket{{le=\""))?;
                let le = le.strip_suffix("\"}")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().expect("le")
                };
                Some((le, *v))
            })
            .collect();
        assert!(buckets.len() >= 2, "{h} has buckets");
        let mut sorted = buckets.clone();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in sorted.windows(2) {
            assert!(
                w[0].1 <= w[1].1,
                "{h}: buckets must be cumulative: {sorted:?}"
            );
        }
        let inf = sorted.last().expect("+Inf bucket");
        assert!(inf.0.is_infinite(), "{h}: last bucket is +Inf");
        assert_eq!(inf.1, s.get(&format!("{h}_count")), "{h}: +Inf == count");
    }
    let is_histogram_part = |name: &str| {
        HISTOGRAMS
            .iter()
            .any(|h| name.starts_with(&format!("{h}_")))
    };
    for (name, value) in &s.series {
        if expected.contains_key(name) || is_histogram_part(name) {
            continue;
        }
        assert_eq!(
            *value, 0.0,
            "{name} should be 0 after this traffic\n{}",
            s.text
        );
    }
}

fn promtool_check(text: &str) {
    assert!(
        common::promtool_check_metrics(text),
        "promtool check metrics failed:\n{text}"
    );
}

fn base_expectations() -> BTreeMap<String, f64> {
    let mut e = BTreeMap::new();
    e.insert("ringlock_ready".to_string(), 1.0);
    e.insert(
        format!(
            "ringlock_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        ),
        1.0,
    );
    e
}

#[test]
fn every_figure_matches_known_traffic() {
    let server = Server::start(&["--metrics-bind", "127.0.0.1:0"]);
    let maddr = server.metrics_addr.expect("metrics= in the listening line");

    // Ready once recovery is done (immediately without a data path).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http_get(maddr, "/healthz");
        if status == 200 {
            assert_eq!(body, "ok\n");
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(Instant::now() < deadline, "/healthz never became 200");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(http_get(maddr, "/nope").0, 404);

    // Before any traffic: everything zero but ready and build_info.
    let s = scrape(&server);
    check_every_figure(&s, &base_expectations());
    promtool_check(&s.text);

    // a holds k1; b's TryLock is busy; c and d queue behind a.
    let mut a = server.connect();
    assert_eq!(a.lock(b"k1", b"a"), b'+');
    let mut b = server.connect();
    assert_eq!(b.try_lock(b"k1", b"b"), b'#');
    let mut c = server.connect();
    c.send(&frame(1, b"k1", Some(b"c")));
    assert!(c.silent_for(50), "c must wait behind a");
    let mut d = server.connect();
    d.send(&frame(1, b"k1", Some(b"d")));
    assert!(d.silent_for(50), "d must wait behind a and c");
    scrape_until(&server, "two queued waiters", |s| {
        s.get("ringlock_queued_waiters") == 2.0
    });
    // c has been queued since at least now.
    let c_queued = Instant::now();

    // d hangs up while queued: withdrawn, never granted.
    drop(d);
    let s = scrape_until(&server, "d's withdrawal", |s| {
        s.get("ringlock_hangup_withdrawals_total") == 1.0
            && s.get("ringlock_queued_waiters") == 1.0
            && s.get("ringlock_open_connections") == 3.0
    });
    assert_eq!(s.get("ringlock_held_keys"), 1.0);

    // The oldest hold ages at scrape time, with nothing happening in the loop.
    let s = scrape_until(&server, "the oldest hold to age past 1.1 s", |s| {
        s.get("ringlock_oldest_hold_seconds") >= 1.1
    });
    let age = s.get("ringlock_oldest_hold_seconds");
    assert!(age < 60.0, "oldest hold age {age}");

    // a unlocks: c is handed k1 after waiting over a second.
    let c_waited_at_least = c_queued.elapsed().as_secs_f64();
    assert_eq!(a.unlock(b"k1"), b'+');
    assert_eq!(c.read_byte(), b'+');

    // e takes k2; f resets it by key, then resets source c (k1), then
    // unlocks a free key; all on one connection.
    let mut e = server.connect();
    assert_eq!(e.lock(b"k2", b"e"), b'+');
    let mut f = server.connect();
    assert_eq!(f.reset_key(b"k2"), b'+');
    assert_eq!(f.reset_source(b"c"), b'+');
    assert_eq!(f.unlock(b"k3"), b'+');

    // Admin port: KEYS (nothing held), RSET of one key, RSBS of one source.
    assert!(keys(server.admin_addr).is_empty());
    assert_eq!(admin_names(server.admin_addr, b"RSET", &[b"k9"]), b"++");
    assert_eq!(admin_names(server.admin_addr, b"RSBS", &[b"zz"]), b"++");

    // A Lock frame with key size 0 is bad input: `-` and closed.
    let mut g = server.connect();
    g.send(&[1, 0]);
    assert_eq!(g.read_byte_or_eof(), Some(b'-'));
    assert_eq!(g.read_byte_or_eof(), None);

    drop((a, b, c, e, f, g));
    let s = scrape_until(&server, "all connections closed", |s| {
        s.get("ringlock_open_connections") == 0.0
    });

    let mut want = base_expectations();
    for (action, result, n) in [
        ("lock", "ok", 3.0),    // a, c (after waiting), e
        ("lock", "error", 1.0), // g's bad frame
        ("trylock", "busy", 1.0),
        ("unlock", "ok", 2.0),
        ("reset_by_key", "ok", 1.0),
        ("reset_by_source", "ok", 1.0),
        ("admin_keys", "ok", 1.0),
        ("admin_rset", "ok", 1.0),
        ("admin_rsbs", "ok", 1.0),
    ] {
        want.insert(req(action, result), n);
    }
    for (name, n) in [
        ("ringlock_grants_total", 3.0),
        // Every Locking-Center grant is exclusive.
        ("ringlock_grants_by_access_total{access=\"exclusive\"}", 3.0),
        ("ringlock_handoffs_total", 1.0),
        ("ringlock_hangup_withdrawals_total", 1.0),
        ("ringlock_resets_total{by=\"key\"}", 2.0), // ResetByKey + RSET
        ("ringlock_resets_total{by=\"source\"}", 2.0), // ResetBySource + RSBS
        ("ringlock_queue_wait_seconds_count", 1.0), // c
        ("ringlock_hold_seconds_count", 3.0),       // k1 by a, k2 by e, k1 by c
    ] {
        want.insert(name.to_string(), n);
    }
    // c waited at least as long as we saw it queued (over a second: the
    // hold aged past 1 s meanwhile); its one observation sits in the first
    // bucket whose bound is at least its wait.
    let waited = s.get("ringlock_queue_wait_seconds_sum");
    assert!(
        waited >= c_waited_at_least && waited < 60.0,
        "queue wait {waited}, seen queued for {c_waited_at_least}"
    );
    want.insert("ringlock_queue_wait_seconds_sum".to_string(), waited);
    for (name, value) in &s.series {
        if let Some(le) = name
            .strip_prefix("ringlock_queue_wait_seconds_bucket{le=\"")
            .and_then(|r| r.strip_suffix("\"}"))
        {
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().expect("le")
            };
            let expect = if waited <= le { 1.0 } else { 0.0 };
            assert_eq!(*value, expect, "{name} for a wait of {waited}s");
        }
    }
    // a held k1 over 1.1 s (its age passed that); the three holds sum to at
    // least that.
    let held = s.get("ringlock_hold_seconds_sum");
    assert!((1.1..180.0).contains(&held), "hold sum {held}");
    want.insert("ringlock_hold_seconds_sum".to_string(), held);
    assert_eq!(
        s.get("ringlock_hold_seconds_bucket{le=\"1\"}"),
        2.0,
        "two short holds, one over a second"
    );

    check_every_figure(&s, &want);
    promtool_check(&s.text);
}

#[test]
fn refusals_and_frame_timeouts_are_counted() {
    let server = Server::start(&[
        "--metrics-bind",
        "127.0.0.1:0",
        "--max-connections",
        "2",
        "--frame-timeout-ms",
        "200",
    ]);
    let a = server.connect();
    let mut b = server.connect();
    scrape_until(&server, "two connections", |s| {
        s.get("ringlock_open_connections") == 2.0
    });

    // Over the limit: `-` and closed.
    let mut over = Conn::connect(server.lock_addr);
    let answer = over.read_byte_or_eof();
    assert!(matches!(answer, Some(b'-') | None), "{answer:?}");

    // b starts a frame and never finishes it: `-` and closed after 200 ms.
    b.send(&[1, 5, b'a']);
    assert_eq!(b.read_byte_or_eof(), Some(b'-'));

    let s = scrape_until(&server, "refusal and frame timeout", |s| {
        s.get("ringlock_connections_refused_total") == 1.0
            && s.get("ringlock_frame_timeouts_total") == 1.0
            && s.get("ringlock_open_connections") == 1.0
    });
    let mut want = base_expectations();
    want.insert("ringlock_connections_refused_total".to_string(), 1.0);
    want.insert("ringlock_frame_timeouts_total".to_string(), 1.0);
    want.insert("ringlock_open_connections".to_string(), 1.0);
    check_every_figure(&s, &want);
    promtool_check(&s.text);
    drop(a);
}

#[test]
fn metrics_are_off_unless_asked_for() {
    let server = Server::start(&[]);
    assert_eq!(server.metrics_addr, None);
}

/// With `--data-path`: the WAL figures follow the log.
#[test]
fn wal_figures_follow_the_log() {
    let dir = std::env::temp_dir().join(format!("ringlock-metrics-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let wal = dir.join("ringlock.wal");
    let wal_arg = wal.to_str().expect("utf-8 temp path").to_string();
    let args = [
        "--metrics-bind",
        "127.0.0.1:0",
        "--data-path",
        wal_arg.as_str(),
    ];

    let mut server = Server::start(&args);
    let mut a = server.connect();
    // Sequential requests: each record is its own batch with its own fsync.
    assert_eq!(a.lock(b"k1", b"a"), b'+');
    assert_eq!(a.unlock(b"k1"), b'+');
    assert_eq!(a.lock(b"k2", b"a"), b'+');
    assert!(wal.exists(), "--data-path created no log file");
    let s = scrape(&server);
    let batches = s.get("ringlock_wal_batch_records_count");
    assert!(batches >= 1.0, "{}", s.text);
    assert_eq!(
        s.get("ringlock_wal_fdatasync_seconds_count"),
        batches,
        "one fdatasync per batch"
    );
    assert_eq!(
        s.get("ringlock_wal_batch_records_sum"),
        3.0,
        "grant k1, release k1, grant k2"
    );
    let written = s.get("ringlock_wal_bytes_written_total");
    let file_len = std::fs::metadata(&wal).expect("wal metadata").len() as f64;
    assert!(
        written > 0.0 && written <= file_len,
        "wrote {written} of a {file_len}-byte log"
    );
    assert_eq!(s.get("ringlock_wal_io_errors_total"), 0.0);
    assert_eq!(s.get("ringlock_wal_compactions_total"), 0.0);
    assert_eq!(s.get("ringlock_held_keys"), 1.0);
    promtool_check(&s.text);

    // Crash with k2 held; the restarted server recovers it, and the stuck-lock
    // gauge sees its original acquire time (the KEYS time does not change).
    let acquired = keys(server.admin_addr)[0].acquired_unix_secs;
    drop(a);
    server.kill9();
    drop(server);
    let server = Server::start(&args);
    assert_eq!(
        keys(server.admin_addr)[0].acquired_unix_secs,
        acquired,
        "recovered with its original acquire time"
    );
    let maddr = server.metrics_addr.expect("metrics addr");
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(maddr, "/healthz").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "/healthz never became 200 after recovery"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = scrape_until(&server, "recovered gauges", |s| {
        s.get("ringlock_held_keys") == 1.0
    });
    assert_eq!(s.get("ringlock_ready"), 1.0);
    // The gauge ages from that time: it reaches 1 s although the new
    // process may be younger than that.
    let s = scrape_until(&server, "the recovered hold to age past 1 s", |s| {
        s.get("ringlock_oldest_hold_seconds") >= 1.0
    });
    let age = s.get("ringlock_oldest_hold_seconds");
    assert!(age < 60.0, "recovered hold age {age}");
    assert!(s.get("ringlock_wal_recovery_seconds") >= 0.0);
    assert_eq!(s.get("ringlock_wal_io_errors_total"), 0.0);
    promtool_check(&s.text);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
