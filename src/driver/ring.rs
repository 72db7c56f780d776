//! The ring: its sizing and set-up, submission (`push`, `reserve_sq`),
//! the wait for completions (a heartbeat-bounded `submit_and_wait`, after
//! an adaptive idle poll), the drain, and the tick loop [`Loop::run`] that
//! turns completions into shard events and the shard's commands into
//! submissions; with the mesh's messages and doorbells between them.

use std::io;

use io_uring::{opcode, types, IoUring};

use super::event_loop::Loop;
use super::mesh::Msg;
use super::sys::now;
use super::user_data::{self as ring_io, Op};
use crate::config::RING_ENTRIES;
use crate::log::Level;
use crate::shard::conn::Port;

/// Ops one connection can have in flight at once: recv, send, cancel.
const OPS_PER_CONN: usize = 3;
/// Log ops in flight at most: two chains of write, timeout, fsync, rename,
/// directory fsync, and a growth step (fallocate, timeout, write, fdatasync).
const LOG_OPS: usize = 14;
/// Multishot accepts, the signal read, and headroom for refusals
/// (send + close each) answered within one tick.
const FIXED_OPS: usize = 3 + 2 * 512;

/// The completion queue must hold every op that can be in flight at once.
fn cq_entries_for(max_conns: usize) -> u32 {
    let need = max_conns * OPS_PER_CONN + LOG_OPS + FIXED_OPS;
    (need.max(2 * RING_ENTRIES as usize)).next_power_of_two() as u32
}

pub(super) fn build_ring(max_conns: usize, shards: usize) -> io::Result<IoUring> {
    // Doorbells from the other shards land in this ring's CQ as well.
    let cq = cq_entries_for(max_conns + 4 * shards);
    let mut b = IoUring::builder();
    // TASKRUN_FLAG: the kernel flags deferred completions in the SQ ring,
    // so an idle poll can see them without entering (see `Loop::wait`).
    b.setup_cqsize(cq)
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag();
    let ring = match b.build(RING_ENTRIES) {
        Ok(r) => r,
        // Older kernels lack DEFER_TASKRUN: fall back to a plain ring.
        Err(_) => IoUring::builder().setup_cqsize(cq).build(RING_ENTRIES)?,
    };
    assert!(
        ring.params().cq_entries() as usize >= max_conns * OPS_PER_CONN + LOG_OPS + FIXED_OPS,
        "completion queue smaller than the ops that can be in flight"
    );
    // Overflowed completions are kept, not dropped (kernel >= 5.5).
    assert!(ring.params().is_feature_nodrop(), "io_uring without NODROP");
    Ok(ring)
}

impl Loop {
    /// Pushes one SQE. A full submission queue is submitted; if the kernel
    /// answers EBUSY (completion backlog) the completions are drained into
    /// the local array — they are dispatched next tick — instead of
    /// spinning.
    ///
    /// # Safety
    /// Every buffer the entry references must stay valid and unmoved until
    /// the entry's final completion: a connection's buffers are `Lent`
    /// until then, log buffers likewise, paths are owned by `LogFiles`,
    /// the signal buffer is boxed in `self`, `REFUSED` is static.
    pub(super) unsafe fn push(&mut self, sqe: io_uring::squeue::Entry) {
        loop {
            // SAFETY: forwarded from the caller.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return;
            }
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => self.drain(),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => panic!("io_uring submit failed while the queue was full: {e}"),
            }
        }
    }

    /// Makes room for `n` entries so that a linked chain reaches the kernel
    /// in one submission (a link does not span submissions).
    pub(super) fn reserve_sq(&mut self, n: usize) {
        loop {
            let sq = self.ring.submission();
            if sq.capacity() - sq.len() >= n {
                return;
            }
            drop(sq);
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => self.drain(),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => panic!("io_uring submit failed: {e}"),
            }
        }
    }

    pub(super) fn arm_signal(&mut self) {
        let buf = &mut *self.signal_buf as *mut libc::signalfd_siginfo as *mut u8;
        let sqe = opcode::Read::new(
            types::Fd(self.signal_fd.expect("the shard that reads signals")),
            buf,
            std::mem::size_of::<libc::signalfd_siginfo>() as u32,
        )
        .build()
        .user_data(ring_io::encode(Op::Signal, 0, 0));
        // SAFETY: the boxed signal buffer lives as long as `self`, and only
        // one read of it is ever in flight (re-armed after its completion).
        unsafe { self.push(sqe) };
    }

    /// Serves until SIGINT/SIGTERM. Returns after queued waiters were
    /// answered `-`.
    pub(super) fn run(&mut self) -> io::Result<()> {
        self.arm_accept(Port::Lock);
        self.arm_accept(Port::Admin);
        if self.signal_fd.is_some() {
            self.arm_signal();
        }
        if self.peers.is_some() {
            self.arm_peer_accept();
        }
        // Recovery may have restored held keys: publish before serving.
        self.shard.begin_tick(now());
        self.shard.end_tick();
        self.shared.metrics.set_ready();
        let me = self.shard.index();
        loop {
            self.wait()?;
            let t = now();
            self.shared.metrics.loop_heartbeat(me, t.mono_us / 1000);
            self.shard.begin_tick(t);
            self.tls_tick(t.mono_us);
            self.drain();
            let mut cqes = std::mem::take(&mut self.cqes);
            for &(ud, res, flags) in &cqes {
                self.dispatch(ud, res, flags);
            }
            cqes.clear();
            if self.cqes.is_empty() {
                self.cqes = cqes;
            }
            self.take_messages();
            if self.stop_requested && !self.shard.stopping() {
                self.shard.stop();
            }
            self.peer_tick(t.mono_us);
            self.settle();
            if let Some(f) = self.shard.cluster_fail_stop() {
                fail_stop(f);
            }
            self.ring_doorbells();
            // A cluster leader runs on until it handed its leadership over
            // (bounded): see Shard::stop.
            if self.stop_requested && self.shard.stop_done() {
                // The Stop doorbells (and farewells) must reach the kernel.
                let _ = self.ring.submit();
                return Ok(());
            }
        }
    }

    /// Handles what the other shards sent.
    fn take_messages(&mut self) {
        let Some(mesh) = self.mesh.as_mut() else {
            return;
        };
        let mut inbox = std::mem::take(&mut self.inbox);
        mesh.drain(&mut inbox);
        for m in inbox.drain(..) {
            match m {
                Msg::Adopt { fd, conn, tls } => self.adopt(fd, conn, tls),
                Msg::Request { from, id, op } => self.shard.on_remote(from, id, op),
                Msg::Reply { id, result } => self.shard.on_reply(id, result),
                Msg::Sess(msg) => self.shard.on_sess(msg),
                Msg::Stop => self.stop_requested = true,
            }
        }
        self.inbox = inbox;
    }

    /// Flushes the outboxes and wakes every shard that got messages.
    fn ring_doorbells(&mut self) {
        let Some(mesh) = self.mesh.as_mut() else {
            return;
        };
        mesh.flush();
        let me = mesh.me;
        let targets: Vec<usize> = (0..mesh.shards()).filter(|&t| mesh.to_ring[t]).collect();
        for t in targets {
            self.mesh.as_mut().expect("a mesh").to_ring[t] = false;
            let fd = self.shared.ring_fd(t);
            let sqe = opcode::MsgRingData::new(
                types::Fd(fd),
                0,
                ring_io::encode(Op::Mesh, 0, me as u32),
                None,
            )
            .build()
            .user_data(ring_io::encode(Op::Ignore, 0, 0));
            // SAFETY: references no buffer; the target ring's fd stays open
            // while its shard runs (a doorbell to a stopped shard fails with
            // EBADF, which is ignored).
            unsafe { self.push(sqe) };
        }
    }

    /// `end_tick`, then the shard's commands, until no command is left
    /// (executing one can produce events: a close, a log chain that could
    /// not start).
    fn settle(&mut self) {
        for _ in 0..64 {
            self.shard.end_tick();
            let mut cmds = std::mem::take(&mut self.cmds);
            self.shard.take_cmds(&mut cmds);
            let idle = cmds.is_empty() && self.closed.is_empty() && self.landings.is_empty();
            for cmd in cmds.drain(..) {
                self.execute(cmd);
            }
            self.cmds = cmds;
            // on_closed produces no commands and closes nothing: the list
            // cannot grow while it is drained.
            for i in 0..self.closed.len() {
                let token = self.closed[i];
                self.shard.on_closed(token);
            }
            self.closed.clear();
            // The list is kept (no allocation per landing): the shard
            // starts no chain while it hears of one.
            let mut landings = std::mem::take(&mut self.landings);
            for (chain, result, buf) in landings.drain(..) {
                self.shard.on_log_landed(chain, result, buf);
            }
            debug_assert!(self.landings.is_empty());
            self.landings = landings;
            if idle {
                return;
            }
        }
        panic!("the shard kept producing commands without an event");
    }

    fn wait(&mut self) -> io::Result<()> {
        let tls_waits = self.client_tls.as_ref().is_some_and(|c| c.pending());
        if !self.cqes.is_empty() || self.shard.busy_between_events() || tls_waits {
            // Completions drained while submitting: dispatch them first.
            // Or the shard has work between events (a snapshot encoded a
            // chunk per tick): submit, take what completed, tick again.
            return self
                .ring
                .submit()
                .map(|_| ())
                .or_else(|e| match e.raw_os_error() {
                    Some(libc::EBUSY) | Some(libc::EINTR) => Ok(()),
                    _ => Err(e),
                });
        }
        let t = now().mono_us;
        if self.idle_poll() {
            return Ok(());
        }
        // Wake at least every heartbeat interval, idle or not: liveness
        // (/livez) reads the heartbeat.
        let beat_us = crate::config::HEARTBEAT_INTERVAL_MS * 1000;
        let next = match (self.shard.next_deadline_us(), self.peer_deadline_us()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut timeout_us =
            Some(next.map_or(beat_us, |d| d.saturating_sub(t).clamp(1000, beat_us)));
        if self.mesh.as_ref().is_some_and(|m| m.backlogged()) {
            // Messages wait for queue space: come back soon.
            timeout_us = Some(1000);
        }
        let r = match timeout_us {
            None => self.ring.submit_and_wait(1),
            Some(us) => {
                let ts = types::Timespec::new()
                    .sec(us / 1_000_000)
                    .nsec(((us % 1_000_000) * 1000) as u32);
                let args = types::SubmitArgs::new().timespec(&ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        // From the start of the poll to the wake-up: what a poll long
        // enough to catch this event would have taken. Not while an append
        // is in flight: that sleep waits for the disk (an fdatasync), not
        // for a client, and says nothing about how soon clients come.
        if self.idle_poll_us > 0 && !self.log.as_ref().is_some_and(|io| io.appending()) {
            self.poll.slept(now().mono_us.saturating_sub(t));
        }
        match r {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME) | Some(libc::EINTR) | Some(libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(io::Error::new(
                e.kind(),
                format!("io_uring_enter failed: {e}"),
            )),
        }
    }

    /// Before sleeping, polls for up to the poll window (adaptive, at most
    /// `idle_poll_us`: see [`poll`](super::poll)) for a completion
    /// (posted, or deferred and flagged in the SQ ring), yielding the CPU
    /// to any other runnable thread between polls. True when one came: the
    /// caller takes it without sleeping. A halted vCPU takes tens of
    /// microseconds to wake, and a connection-per-request client pays that
    /// several times per request (accept, receive, send, close are separate
    /// events); an awake loop does not.
    fn idle_poll(&mut self) -> bool {
        let window_us = self.poll.window_us();
        if window_us == 0 {
            return false;
        }
        // What the last tick queued goes out first.
        if let Err(e) = self.ring.submit() {
            if !matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EINTR)) {
                return false;
            }
        }
        let t0 = now().mono_us;
        loop {
            if self.ring.submission().taskrun() {
                // Deferred completions: an enter with GETEVENTS posts them.
                let _ = self.ring.submit();
            }
            if !self.ring.completion().is_empty() {
                return true;
            }
            if now().mono_us.saturating_sub(t0) >= window_us {
                return false;
            }
            std::thread::yield_now();
        }
    }

    fn drain(&mut self) {
        for cqe in self.ring.completion() {
            self.cqes.push((cqe.user_data(), cqe.result(), cqe.flags()));
        }
    }
}

/// A replica must stop its node (see [`crate::shard::raft::FailStop`]):
/// one line saying which group, entry and why, then the whole process
/// ends with the fail-stop's exit status — every shard with it, at once
/// (`_exit`: no other shard runs another step, nothing is flushed that the
/// log did not already make durable; stderr is unbuffered).
fn fail_stop(f: &crate::shard::raft::FailStop) -> ! {
    log!(
        Level::Error,
        f.event(),
        "group={} index={} exit_code={} error=\"{}\" action=\"{}\"",
        f.group,
        f.index.map_or("none".to_string(), |i| i.to_string()),
        f.exit_code(),
        crate::log::Escaped(&f.why),
        f.action()
    );
    // SAFETY: _exit(2) ends the process; it touches no memory of ours (no
    // destructor runs, so no buffer lent to the kernel is freed under it).
    // Were the process left running, a dead shard would sit behind a live
    // node: tests/peer_hostile.rs's fail-stop test checks exit 65.
    unsafe { libc::_exit(i32::from(f.exit_code())) }
}
