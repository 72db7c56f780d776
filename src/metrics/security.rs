//! The security series: peer links and certificates. Rendered only on a
//! node with `--certs-dir` or `--peers` (a plain single node's output is
//! unchanged).

use std::fmt::Write;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use super::{counter, gauge, header};

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

    pub fn set_cert_not_after_s(&self, unix_s: u64) {
        self.cert_not_after_s.store(unix_s, Relaxed);
    }

    pub(super) fn render(&self, w: &mut String) {
        if !self.enabled.load(Relaxed) {
            return;
        }
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
}
