//! The Prometheus text rendering of [`Metrics`]: every series a scrape
//! answers, in the text format 0.0.4.

use std::fmt::Write as _;

use super::super::histogram::{push_seconds, seconds_histogram, BATCH_BOUNDS};
use super::super::text::{counter, gauge, header};
use super::*;

impl Metrics {
    /// Appends every metric in the Prometheus text format 0.0.4 to `out`.
    /// `now_unix_ms` is the scrape time, used only for `oldest_hold_seconds`.
    pub fn render(&self, out: &mut String, now_unix_ms: u64) {
        // fmt::Write into a String cannot fail; here and in the parts below
        // the results are ignored on purpose.
        let w = out;
        self.render_gauges(w);
        self.render_requests(w);
        self.render_grant_counters(w);
        self.render_session_counters(w);
        self.render_connection_counters(w);
        self.render_hold_times(w, now_unix_ms);
        self.render_wal(w);
        self.render_status(w);
        if let Some(r) = self.raft.get() {
            r.render(w);
        }
        self.security.render(w);
    }

    /// The gauges of the table and connections: totals, then per shard
    /// when there is more than one.
    fn render_gauges(&self, w: &mut String) {
        gauge(
            w,
            "held_keys",
            "Keys currently held.",
            self.sum(|h| &h.held_keys),
        );
        header(
            w,
            "holders",
            "Holders currently, by how they hold their key (a shared key's readers and a semaphore's holders each count).",
            "gauge",
        );
        for (i, access) in ["exclusive", "shared", "semaphore"].iter().enumerate() {
            let _ = writeln!(
                w,
                "ringlock_holders{{access=\"{access}\"}} {}",
                self.sum(|h| &h.holders[i])
            );
        }
        gauge(
            w,
            "queued_waiters",
            "Lock requests currently queued behind a holder.",
            self.sum(|h| &h.queued_waiters),
        );
        gauge(
            w,
            "open_connections",
            "Client connections currently open (lock and admin ports).",
            self.sum(|h| &h.open_connections),
        );
        if self.hot.len() > 1 {
            type Field = fn(&Hot) -> &AtomicU64;
            let series: [(&str, &str, Field); 3] = [
                ("shard_held_keys", "Keys currently held, per shard.", |h| {
                    &h.held_keys
                }),
                (
                    "shard_queued_waiters",
                    "Lock requests currently queued, per shard.",
                    |h| &h.queued_waiters,
                ),
                (
                    "shard_open_connections",
                    "Connections currently open, per shard.",
                    |h| &h.open_connections,
                ),
            ];
            for (name, help, f) in series {
                header(w, name, help, "gauge");
                for (i, h) in self.hot.iter().enumerate() {
                    let _ = writeln!(w, "ringlock_{name}{{shard=\"{i}\"}} {}", f(h).load(Relaxed));
                }
            }
        }
    }

    /// `requests_total`: every Locking-Center and admin action by
    /// outcome, every session op by status.
    fn render_requests(&self, w: &mut String) {
        header(
            w,
            "requests_total",
            "Requests answered, by protocol (lc, admin, session), action and result (lc and admin: + ok, # busy, - error; session: the Reply's status).",
            "counter",
        );
        for action in Action::ALL {
            for outcome in Outcome::ALL {
                let _ = writeln!(
                    w,
                    "ringlock_requests_total{{protocol=\"{}\",action=\"{}\",result=\"{}\"}} {}",
                    action.protocol(),
                    action.label(),
                    outcome.label(),
                    self.requests(action, outcome)
                );
            }
        }
        for op in SessionOp::ALL {
            for status in SESSION_STATUSES {
                let n = self.session_requests(op, status);
                if n != 0 || op.statuses().contains(&status) {
                    let _ = writeln!(
                        w,
                        "ringlock_requests_total{{protocol=\"session\",action=\"{}\",result=\"{}\"}} {n}",
                        op.label(),
                        status.name(),
                    );
                }
            }
        }
    }

    /// Grants, and grants that never reached their client.
    fn render_grant_counters(&self, w: &mut String) {
        counter(
            w,
            "grants_total",
            "Locks granted, immediately or after waiting.",
            self.sum(|h| &h.grants),
        );
        let (all, shared, semaphore) = (
            self.sum(|h| &h.grants),
            self.sum(|h| &h.shared_grants),
            self.sum(|h| &h.semaphore_grants),
        );
        header(
            w,
            "grants_by_access_total",
            "Locks granted, by how they hold their key.",
            "counter",
        );
        for (access, n) in [
            ("exclusive", all.saturating_sub(shared + semaphore)),
            ("shared", shared),
            ("semaphore", semaphore),
        ] {
            let _ = writeln!(
                w,
                "ringlock_grants_by_access_total{{access=\"{access}\"}} {n}"
            );
        }
        counter(
            w,
            "handoffs_total",
            "Grants to a waiter that had been queued.",
            self.sum(|h| &h.handoffs),
        );
        counter(
            w,
            "hangup_withdrawals_total",
            "Queued lock requests withdrawn because the client hung up.",
            self.hangup_withdrawals.load(Relaxed),
        );
        counter(
            w,
            "undelivered_grants_total",
            "Grants released again because the client was gone before its + could be delivered.",
            self.undelivered_grants.load(Relaxed),
        );
    }

    /// Sessions opened, resumed and ended, and Lost pushes.
    fn render_session_counters(&self, w: &mut String) {
        counter(
            w,
            "sessions_opened_total",
            "Session connections opened (Hello).",
            self.sessions_opened.load(Relaxed),
        );
        counter(
            w,
            "sessions_resumed_total",
            "Replicated sessions taken over by a new connection (Resume), after a failover or from a connection the server still had.",
            self.sessions_resumed.load(Relaxed),
        );
        counter(
            w,
            "sessions_ended_total",
            "Sessions ended: connection closed or failed, or keep-alive deadline passed.",
            self.sessions_ended.load(Relaxed),
        );
        counter(
            w,
            "sessions_expired_total",
            "Sessions ended because nothing arrived from the client within its keep-alive deadline.",
            self.sessions_expired.load(Relaxed),
        );
        counter(
            w,
            "lost_pushed_total",
            "Lost messages pushed to sessions (a lease expired, or an operator reset a hold).",
            self.lost_pushed.load(Relaxed),
        );
        gauge(
            w,
            "watches",
            "Key watches open (session Watch).",
            self.watches.load(Relaxed).max(0) as u64,
        );
        counter(
            w,
            "watch_events_total",
            "Events pushed to key watches (a grant or a release of a watched key; not the holders listed when a watch begins).",
            self.watch_events.load(Relaxed),
        );
    }

    /// Connections closed or refused, requests refused, and operator
    /// resets.
    fn render_connection_counters(&self, w: &mut String) {
        counter(
            w,
            "idle_timeouts_total",
            "Connections closed after --idle-timeout without traffic and without a request in flight.",
            self.idle_timeouts.load(Relaxed),
        );
        counter(
            w,
            "auth_failures_total",
            "Session hellos and admin connections refused for a missing or wrong auth token.",
            self.auth_failures.load(Relaxed),
        );
        counter(
            w,
            "lc_actions_refused_total",
            "Lock-port Unlock, ResetByKey and ResetBySource refused by --lc-admin-actions.",
            self.lc_actions_refused.load(Relaxed),
        );

        header(
            w,
            "resets_total",
            "Operator resets, one per key (ResetByKey, RSET) or source (ResetBySource, RSBS) named.",
            "counter",
        );
        let _ = writeln!(
            w,
            "ringlock_resets_total{{by=\"key\"}} {}",
            self.resets_by_key.load(Relaxed)
        );
        let _ = writeln!(
            w,
            "ringlock_resets_total{{by=\"source\"}} {}",
            self.resets_by_source.load(Relaxed)
        );

        counter(
            w,
            "connections_refused_total",
            "Connections refused because the connection limit was reached.",
            self.connections_refused.load(Relaxed),
        );
        counter(
            w,
            "frame_timeouts_total",
            "Connections closed because a request frame did not complete in time.",
            self.frame_timeouts.load(Relaxed),
        );
    }

    /// How long locks waited and were held, and the oldest hold
    /// (`now_unix_ms`: the scrape time).
    fn render_hold_times(&self, w: &mut String, now_unix_ms: u64) {
        seconds_histogram(
            w,
            "queue_wait_seconds",
            "Time a lock request waited in a queue before its grant.",
            self.hot.iter().map(|h| &h.queue_wait_us),
        );
        seconds_histogram(
            w,
            "hold_seconds",
            "Time a key was held, observed at its release.",
            self.hot.iter().map(|h| &h.hold_us),
        );

        header(
            w,
            "oldest_hold_seconds",
            "Age of the oldest currently held key; 0 when no key is held.",
            "gauge",
        );
        let oldest_ms = self
            .hot
            .iter()
            .map(|h| h.oldest_acquired_unix_ms.load(Relaxed))
            .filter(|&v| v != 0)
            .min()
            .unwrap_or(0);
        let age_ms = if oldest_ms == 0 {
            0
        } else {
            now_unix_ms.saturating_sub(oldest_ms)
        };
        w.push_str("ringlock_oldest_hold_seconds ");
        push_seconds(w, age_ms.saturating_mul(1_000));
        w.push('\n');
    }

    /// The write-ahead log: sync latency, batch sizes, bytes, compactions,
    /// recovery time, failures.
    fn render_wal(&self, w: &mut String) {
        seconds_histogram(
            w,
            "wal_fdatasync_seconds",
            "Latency of WAL fdatasync calls.",
            std::iter::once(&self.fdatasync_us),
        );

        header(
            w,
            "wal_batch_records",
            "Records per WAL group-commit batch.",
            "histogram",
        );
        let mut cumulative = 0;
        for (i, bound) in BATCH_BOUNDS.iter().enumerate() {
            cumulative += self.wal_batch_records.buckets[i].load(Relaxed);
            let _ = writeln!(
                w,
                "ringlock_wal_batch_records_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += self.wal_batch_records.buckets[BATCH_BOUNDS.len()].load(Relaxed);
        let _ = writeln!(
            w,
            "ringlock_wal_batch_records_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(
            w,
            "ringlock_wal_batch_records_sum {}",
            self.wal_batch_records.sum()
        );
        let _ = writeln!(w, "ringlock_wal_batch_records_count {cumulative}");

        counter(
            w,
            "wal_bytes_written_total",
            "Bytes appended to the WAL.",
            self.wal_bytes_written.load(Relaxed),
        );
        counter(
            w,
            "wal_compactions_total",
            "WAL compactions completed.",
            self.wal_compactions.load(Relaxed),
        );

        header(
            w,
            "wal_recovery_seconds",
            "Time the last start-up spent replaying the WAL.",
            "gauge",
        );
        w.push_str("ringlock_wal_recovery_seconds ");
        push_seconds(w, self.recovery_us.load(Relaxed));
        w.push('\n');

        counter(
            w,
            "wal_io_errors_total",
            "WAL write or fdatasync failures.",
            self.wal_io_errors.load(Relaxed),
        );
    }

    /// Readiness and the build.
    fn render_status(&self, w: &mut String) {
        gauge(
            w,
            "ready",
            "1 once WAL recovery is done and the server accepts requests.",
            u64::from(self.is_ready()),
        );

        header(
            w,
            "build_info",
            "Build information; the value is always 1.",
            "gauge",
        );
        let _ = writeln!(
            w,
            "ringlock_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
    }
}
