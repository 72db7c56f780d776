//! The security series: peer links and certificates. Rendered only on a
//! node with `--certs-dir` or `--peers` (a plain single node's output is
//! unchanged).

use std::fmt::Write;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use super::text::{counter, gauge, header};

pub struct Security {
    enabled: AtomicBool,
    insecure: AtomicBool,
    peer_links_accepted: AtomicU64,
    peer_links_refused: AtomicU64,
    /// Per shard: live accepted peer links.
    peer_links: Box<[AtomicU64]>,
    cert_reloads_ok: AtomicU64,
    cert_reloads_failed: AtomicU64,
    /// Unix seconds at which the node certificate in use expires; 0: none.
    cert_not_after_s: AtomicU64,
    /// Client-port TLS handshakes by result: ok, failed, timed out.
    tls_handshakes: [AtomicU64; 3],
    /// Time spent in client-port handshakes' TLS processing (µs).
    tls_handshake_us: AtomicU64,
    /// Plaintext refused by a TLS-only port: Locking-Center or admin, session.
    plaintext_refused: [AtomicU64; 2],
}

/// How a client-port TLS handshake ended.
#[derive(Clone, Copy, Debug)]
pub enum Handshake {
    Ok = 0,
    Failed = 1,
    TimedOut = 2,
}

impl Security {
    pub(super) fn new(loops: usize) -> Security {
        Security {
            enabled: AtomicBool::new(false),
            insecure: AtomicBool::new(false),
            peer_links_accepted: AtomicU64::new(0),
            peer_links_refused: AtomicU64::new(0),
            peer_links: (0..loops).map(|_| AtomicU64::new(0)).collect(),
            cert_reloads_ok: AtomicU64::new(0),
            cert_reloads_failed: AtomicU64::new(0),
            cert_not_after_s: AtomicU64::new(0),
            tls_handshakes: Default::default(),
            tls_handshake_us: AtomicU64::new(0),
            plaintext_refused: Default::default(),
        }
    }

    /// The series are rendered from now on; `insecure`: a cluster without
    /// certificates (`--insecure`).
    pub fn enable(&self, insecure: bool) {
        self.insecure.store(insecure, Relaxed);
        self.enabled.store(true, Relaxed);
    }

    pub fn peer_link_accepted(&self) {
        self.peer_links_accepted.fetch_add(1, Relaxed);
    }

    pub fn peer_link_refused(&self) {
        self.peer_links_refused.fetch_add(1, Relaxed);
    }

    pub fn set_peer_links(&self, shard: usize, n: u64) {
        if let Some(g) = self.peer_links.get(shard) {
            g.store(n, Relaxed);
        }
    }

    pub fn cert_reload(&self, ok: bool) {
        if ok {
            self.cert_reloads_ok.fetch_add(1, Relaxed);
        } else {
            self.cert_reloads_failed.fetch_add(1, Relaxed);
        }
    }

    pub fn tls_handshake(&self, how: Handshake) {
        self.tls_handshakes[how as usize].fetch_add(1, Relaxed);
    }

    pub fn tls_handshake_time(&self, us: u64) {
        self.tls_handshake_us.fetch_add(us, Relaxed);
    }

    /// A plaintext connection refused by a TLS-only port (`session`: its
    /// first frame was a session frame).
    pub fn plaintext_refused(&self, session: bool) {
        self.plaintext_refused[session as usize].fetch_add(1, Relaxed);
    }

    pub fn set_cert_not_after_s(&self, unix_s: u64) {
        self.cert_not_after_s.store(unix_s, Relaxed);
    }

    /// The security series (cluster nodes and TLS servers only).
    pub(super) fn render(&self, w: &mut String) {
        if !self.enabled.load(Relaxed) {
            return;
        }
        self.render_peer_links(w);
        self.render_cert_reloads(w);
        self.render_tls_ports(w);
        let na = self.cert_not_after_s.load(Relaxed);
        if na > 0 {
            gauge(
                w,
                "cert_expiry_timestamp_seconds",
                "When the node certificate in use expires (Unix seconds).",
                na,
            );
        }
    }

    /// Whether the node runs without certificates, and its peer (Raft)
    /// links accepted, refused and open.
    fn render_peer_links(&self, w: &mut String) {
        gauge(
            w,
            "insecure",
            "1 when this cluster node runs without certificates (--insecure): anyone who \
             reaches its Raft ports can join, stall or rewrite the cluster.",
            self.insecure.load(Relaxed) as u64,
        );
        counter(
            w,
            "peer_links_accepted_total",
            "Connections accepted on the Raft (peer) ports.",
            self.peer_links_accepted.load(Relaxed),
        );
        counter(
            w,
            "peer_links_refused_total",
            "Peer connections closed for a reason (a plaintext or unauthenticated dialer, a \
             Hello that does not match its certificate, no Hello in time, an oversized frame).",
            self.peer_links_refused.load(Relaxed),
        );
        gauge(
            w,
            "peer_links",
            "Accepted peer connections open now.",
            self.peer_links.iter().map(|g| g.load(Relaxed)).sum(),
        );
    }

    /// Certificate reloads by result.
    fn render_cert_reloads(&self, w: &mut String) {
        header(
            w,
            "cert_reloads_total",
            "Certificate reloads (SIGHUP) by result; a failed reload keeps the certificates in use.",
            "counter",
        );
        let _ = writeln!(
            w,
            "ringlock_cert_reloads_total{{result=\"ok\"}} {}",
            self.cert_reloads_ok.load(Relaxed)
        );
        let _ = writeln!(
            w,
            "ringlock_cert_reloads_total{{result=\"failed\"}} {}",
            self.cert_reloads_failed.load(Relaxed)
        );
    }

    /// The lock and admin ports' TLS: handshakes by result, their time, and
    /// plaintext connections refused.
    fn render_tls_ports(&self, w: &mut String) {
        header(
            w,
            "tls_handshakes_total",
            "TLS handshakes on the lock and admin ports by result (failed: a bad or missing \
             certificate, a protocol error; timed_out: not finished within --frame-timeout).",
            "counter",
        );
        for (i, result) in ["ok", "failed", "timed_out"].iter().enumerate() {
            let _ = writeln!(
                w,
                "ringlock_tls_handshakes_total{{result=\"{result}\"}} {}",
                self.tls_handshakes[i].load(Relaxed)
            );
        }
        header(
            w,
            "tls_handshake_seconds_total",
            "Time the event loops spent processing client-port TLS handshakes (their crypto).",
            "counter",
        );
        let _ = writeln!(
            w,
            "ringlock_tls_handshake_seconds_total {:.6}",
            self.tls_handshake_us.load(Relaxed) as f64 / 1e6
        );
        header(
            w,
            "plaintext_refused_total",
            "Plaintext connections refused by a TLS-only lock or admin port, by protocol.",
            "counter",
        );
        for (i, protocol) in ["lc_or_admin", "session"].iter().enumerate() {
            let _ = writeln!(
                w,
                "ringlock_plaintext_refused_total{{protocol=\"{protocol}\"}} {}",
                self.plaintext_refused[i].load(Relaxed)
            );
        }
    }
}
