//! The log's I/O: submits what the write planner ([`wal::plan::Writer`])
//! says and reports each completion back to it. Every decision — pieces,
//! syncs, resumption after a short write, growth steps, parked appends,
//! switching files after a compaction — is the planner's; this file only
//! turns its steps into SQEs, owns the buffers and descriptors they use
//! (held in [`LogIo`], `logio_state.rs`), and applies test-only fault
//! injection (`faults`).
//!
//! `user_data`: the records stream's ops are [`Op::WalWrite`], the
//! compaction's [`Op::WalSync`], the slot the step's kind ([`STEP_WRITE`]
//! …); a growth step's ops are `WalWrite` with slots from
//! [`STEP_GROW_ALLOC`] up.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use io_uring::{opcode, types};

use super::buf::{Lent, Slot};
use super::event_loop::Loop;
use super::logio_state::{
    GrowIo, LogIo, STEP_DELAY, STEP_DIR_SYNC, STEP_GROW_ALLOC, STEP_GROW_DELAY, STEP_GROW_SYNC,
    STEP_GROW_WRITE, STEP_RENAME, STEP_SYNC, STEP_WRITE,
};
use super::sys::now;
use super::user_data::{self as ring_io, Op};
use crate::log::Level;
use crate::wal;
use crate::wal::log::Chain;
use crate::wal::plan::{Batch, Files, Grown, Kind, Next, Step, Stream, Target};

fn op_of(stream: Stream) -> Op {
    match stream {
        Stream::Records => Op::WalWrite,
        Stream::Compact => Op::WalSync,
    }
}

fn step_code(kind: Kind) -> u32 {
    match kind {
        Kind::Write => STEP_WRITE,
        Kind::Sync => STEP_SYNC,
        Kind::Rename => STEP_RENAME,
        Kind::SyncDir => STEP_DIR_SYNC,
    }
}

impl Loop {
    fn log_io(&mut self) -> &mut LogIo {
        self.log.as_mut().expect("a log chain without a log")
    }

    /// The shard closes and removes the compaction's temp file (unless
    /// renamed): no chain uses it.
    pub(super) fn discard_temp(&mut self) {
        let io = self.log_io();
        if let Some(f) = io.temp.take() {
            drop(f);
            if !io.plan.temp_renamed() {
                // SAFETY: valid C string owned by LogFiles.
                unsafe { libc::unlink(io.files.temp_path.as_ptr()) };
            }
        }
        io.plan.temp_discarded();
    }

    /// A chain from the shard: hand it to the planner, do what it says.
    pub(super) fn start_chain(&mut self, chain: Chain, buf: Vec<u8>) {
        let io = self.log_io();
        let stream = Stream::of(chain);
        let (grow, next) = io.plan.start(chain, buf.len(), now().mono_us);
        if let Some(g) = grow {
            self.submit_grow(g.from, g.len);
        }
        let io = self.log_io();
        match next {
            Next::Parked => {
                assert!(io.parked.is_none(), "one records chain at a time");
                io.parked = Some((chain, buf));
            }
            next => {
                io.bufs[stream as usize] = Some(Slot::Ours(buf));
                self.follow(stream, next);
            }
        }
    }

    /// Carries out the planner's next step for `stream`.
    fn follow(&mut self, stream: Stream, next: Next) {
        match next {
            Next::Pending => {}
            Next::Parked => unreachable!("only a start parks"),
            Next::Submit(batch) => self.submit_batch(batch),
            Next::OpenTemp => {
                let io = self.log_io();
                assert!(io.temp.is_none(), "a temp file is already open");
                // SAFETY: valid C string; flags create a new private file.
                let fd = unsafe {
                    libc::open(
                        io.files.temp_path.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
                        0o644,
                    )
                };
                let result = if fd < 0 {
                    let e = io::Error::last_os_error();
                    log!(
                        Level::Error,
                        "wal_io_error",
                        "op=open_temp path={} error=\"{}\"",
                        io.files.path.display(),
                        e
                    );
                    Err(-e.raw_os_error().unwrap_or(libc::EIO))
                } else {
                    // SAFETY: a fresh fd we own from here on.
                    io.temp = Some(unsafe { File::from_raw_fd(fd) });
                    Ok(())
                };
                let next = io.plan.temp_opened(stream, result);
                self.follow(stream, next);
            }
            Next::Landed(landing) => {
                let io = self.log_io();
                let buf = io.bufs[stream as usize]
                    .take()
                    .expect("a landed chain's buffer")
                    .take_ours();
                match landing.files {
                    Files::Unchanged => {}
                    Files::Replaced => {
                        let new = io.temp.take().expect("the renamed temp file");
                        let old = std::mem::replace(&mut io.files.file, new);
                        // The replaced log; its name is gone.
                        wal::retire(old);
                    }
                    Files::DiscardTemp { .. } => self.discard_temp(),
                }
                self.landings.push((landing.chain, landing.result, buf));
            }
        }
    }

    /// Submits one batch of the planner as a linked chain of SQEs.
    fn submit_batch(&mut self, batch: Batch) {
        let io = self.log_io();
        let stream = batch.stream;
        let s = stream as usize;
        let batch = io.with_write_fault(batch);
        io.plan.submitted(&batch);
        let op = op_of(stream);
        let buf = io.lend_chain_buf(s, op);
        let delay = io.fsync_delay_of(&batch);
        let n = batch.len();
        let (sqes, count) = io.chain_sqes(&batch, op, buf, delay);
        io.extra_ops[s] = (count - n) as u32;
        self.reserve_sq(count);
        for sqe in sqes.into_iter().flatten() {
            // SAFETY: the chain's buffer is `Lent` until the batch's last
            // completion (on_chain_op reclaims it when the planner says
            // the batch is done); paths are owned by LogFiles and the fault
            // timespec by Faults, both for the server's whole life; fds
            // stay open until the chain concludes (discard_temp runs only
            // with no chain in flight on the temp file). A buffer taken
            // back early panics in `Lent::reclaim` (another op's
            // completion) or aborts on drop (buf.rs tests);
            // tests/wal_crash.rs fails if a `+` leaves before this chain's
            // write completed.
            unsafe { self.push(sqe) };
        }
    }

    /// Starts a growth step the planner asked for: zeros over
    /// `[from, from + len)` written with O_DIRECT, then fdatasync.
    fn submit_grow(&mut self, from: u64, len: u64) {
        let io = self.log_io();
        // O_DIRECT: the zeros bypass the page cache. Written through it,
        // they would be dirty pages of the log, and every append's
        // fdatasync (which flushes the whole file) would wait for them. A
        // file system without O_DIRECT gets buffered zeros.
        let path = format!("/proc/self/fd/{}", io.files.fd());
        let open = |flags| {
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(flags)
                .open(&path)
        };
        let (zeros, file) = match wal::zeros().and_then(|z| {
            let f = open(libc::O_DIRECT).or_else(|_| open(0))?;
            Ok((z, f))
        }) {
            Ok(v) => v,
            Err(e) => {
                io.plan.grow_unavailable();
                log!(
                    Level::Warn,
                    "wal_preallocate_failed",
                    "path={} file=current op=reopen error=\"{}\" effect=appends_grow_the_file",
                    crate::log::path(&io.files.path),
                    e
                );
                return;
            }
        };
        let len = len.min(zeros.len() as u64);
        let fd = file.as_raw_fd();
        // The fallocate only asks for the space in one piece: a hard link,
        // so the zeros are written even where it is not supported.
        let alloc = opcode::Fallocate::new(types::Fd(fd), len)
            .offset(from)
            .build()
            .flags(io_uring::squeue::Flags::IO_HARDLINK)
            .user_data(ring_io::encode(Op::WalWrite, 0, STEP_GROW_ALLOC));
        let write = opcode::Write::new(types::Fd(fd), zeros.as_ptr(), len as u32)
            .offset(from)
            .build()
            .flags(io_uring::squeue::Flags::IO_LINK)
            .user_data(ring_io::encode(Op::WalWrite, 0, STEP_GROW_WRITE));
        let sync = opcode::Fsync::new(types::Fd(fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build()
            .user_data(ring_io::encode(Op::WalWrite, 0, STEP_GROW_SYNC));
        // Test-only (fault grow_delay_ms): a timeout before the zero write.
        let delay = io.faults.grow_delay().map(|ts| {
            opcode::Timeout::new(ts)
                .flags(types::TimeoutFlags::ETIME_SUCCESS)
                .build()
                .flags(io_uring::squeue::Flags::IO_HARDLINK)
                .user_data(ring_io::encode(Op::WalWrite, 0, STEP_GROW_DELAY))
        });
        let sqes = [Some(alloc), delay, Some(write), Some(sync)];
        let n = sqes.iter().flatten().count();
        io.grow = Some(GrowIo {
            file,
            len,
            ops_left: n as u32,
            error: None,
            fail_injected: io.faults.plan_grow(),
        });
        self.reserve_sq(n);
        for sqe in sqes.into_iter().flatten() {
            // SAFETY: the zeros are a read-only mapping kept for the
            // process's life (wal::zeros), so nothing writes them; the
            // step's file stays open in `grow` until its last completion
            // (on_grow_op) or is leaked when the loop stops; the fault
            // timespec is owned by Faults for the server's life. A
            // descriptor closed early could be reused by the next open and
            // the linked zero write would land in that file;
            // tests/wal_prealloc_crash.rs runs growth steps all the time
            // (and delayed) under kill -9.
            unsafe { self.push(sqe) };
        }
    }

    pub(super) fn on_grow_op(&mut self, step: u32, res: i32) {
        let io = self.log_io();
        let g = io
            .grow
            .as_mut()
            .expect("a growth completion with none in flight");
        match step {
            // Advisory: the zero write decides.
            STEP_GROW_ALLOC | STEP_GROW_DELAY => {}
            STEP_GROW_WRITE => {
                let res = if g.fail_injected { -libc::ENOSPC } else { res };
                if res < 0 {
                    g.error.get_or_insert(res);
                } else if res as u64 != g.len {
                    // Short: the link is broken, the fdatasync cancelled.
                    g.error.get_or_insert(-libc::ENOSPC);
                }
            }
            STEP_GROW_SYNC => {
                if res < 0 {
                    g.error.get_or_insert(res);
                }
            }
            _ => panic!("unknown growth step {step}"),
        }
        g.ops_left -= 1;
        if g.ops_left > 0 {
            return;
        }
        let g = io.grow.take().expect("the step just concluded");
        let result = g.error.map_or(Ok(()), Err);
        let (outcome, unpark) = io.plan.grown(result, now().mono_us);
        let path = crate::log::path(&io.files.path);
        match outcome {
            Grown::Done {
                from,
                bytes,
                took_us,
                append_waited,
            } => log!(
                Level::Debug,
                "wal_grown",
                "path={} offset={} bytes={} duration_us={} append_waited={}",
                path,
                from,
                bytes,
                took_us,
                append_waited
            ),
            Grown::Failed { from, bytes, errno } => log!(
                Level::Warn,
                "wal_preallocate_failed",
                "path={} file=current offset={} bytes={} error=\"{}\" effect=appends_grow_the_file",
                path,
                from,
                bytes,
                io::Error::from_raw_os_error(-errno)
            ),
            Grown::Stale {
                from,
                bytes,
                errno: Some(errno),
            } => log!(
                Level::Warn,
                "wal_preallocate_failed",
                "path={} file=replaced offset={} bytes={} error=\"{}\" effect=none",
                path,
                from,
                bytes,
                io::Error::from_raw_os_error(-errno)
            ),
            Grown::Stale { .. } => {}
        }
        drop(g.file);
        if unpark {
            let (chain, buf) = io.parked.take().expect("the parked append");
            self.start_chain(chain, buf);
        }
    }

    pub(super) fn on_chain_op(&mut self, stream: Stream, step: u32, res: i32) {
        let io = self.log_io();
        let s = stream as usize;
        let kind = match step {
            STEP_WRITE => Kind::Write,
            STEP_SYNC => Kind::Sync,
            STEP_RENAME => Kind::Rename,
            STEP_DIR_SYNC => Kind::SyncDir,
            STEP_DELAY => {
                // Not one of the planner's steps; it completes before the
                // fdatasync it delays.
                io.extra_ops[s] -= 1;
                return;
            }
            _ => panic!("unknown log chain step {step}"),
        };
        let res = match kind {
            Kind::Write if io.fail_injected[s] => -libc::ENOSPC,
            Kind::Sync if res != -libc::ECANCELED => io.faults.fsync_result(res),
            _ => res,
        };
        let next = io.plan.completed(stream, kind, res);
        if !matches!(next, Next::Pending) {
            // The batch's last completion: its buffer is ours again.
            assert_eq!(io.extra_ops[s], 0, "a fault's delay outlived its batch");
            let tag = ring_io::encode(op_of(stream), 0, STEP_WRITE);
            let slot = io.bufs[s].as_mut().expect("the chain's buffer");
            slot.reclaim(tag);
        }
        self.follow(stream, next);
    }
}

/// A batch's SQEs, in order: at most the four steps and a fault's delay;
/// no allocation per batch (tests/no_alloc.rs).
type ChainSqes = [Option<io_uring::squeue::Entry>; 5];

/// The parts of [`Loop::submit_batch`] that touch only the log's I/O state.
impl LogIo {
    /// Test-only fault injection: a shortened or failing write goes
    /// alone, as the kernel ends a chain after a real short or failed
    /// write. The batch to submit.
    fn with_write_fault(&mut self, batch: Batch) -> Batch {
        let stream = batch.stream;
        let Step::Write { len: planned, .. } = batch.write() else {
            unreachable!("a batch starts with its write")
        };
        let (len, _no, fail) = self.faults.plan_write(planned, stream == Stream::Compact);
        self.fail_injected[stream as usize] = fail;
        if len < planned || fail {
            batch.write_alone(len)
        } else {
            batch
        }
    }

    /// Lends stream `s`'s chain buffer to the kernel (tagged as `op`'s
    /// write): its start and length, for the batch's writes.
    fn lend_chain_buf(&mut self, s: usize, op: Op) -> (*const u8, usize) {
        let slot = self.bufs[s].as_mut().expect("the chain's buffer");
        let tag = ring_io::encode(op, 0, STEP_WRITE);
        let mut lent = Lent::lend(slot.take_ours(), tag);
        let buf_ptr = lent.mut_ptr() as *const u8;
        let buf_len = lent.len();
        *slot = Slot::Kernel(lent);
        (buf_ptr, buf_len)
    }

    /// Test-only (fault fsync_delay_ms): the delay to link after the
    /// batch's write, for a write to the log that more steps follow.
    fn fsync_delay_of(&self, batch: &Batch) -> Option<*const types::Timespec> {
        if matches!(
            batch.write(),
            Step::Write {
                target: Target::Log,
                ..
            }
        ) && batch.len() > 1
        {
            self.faults.fsync_delay()
        } else {
            None
        }
    }

    /// The batch's SQEs, each but the last linked to the next, with the
    /// fault's `delay` (if any) after the write; and how many there are.
    /// `buf`: the lent chain buffer's start and length.
    fn chain_sqes(
        &self,
        batch: &Batch,
        op: Op,
        buf: (*const u8, usize),
        delay: Option<*const types::Timespec>,
    ) -> (ChainSqes, usize) {
        let log_fd = self.files.fd();
        let temp_fd = self.temp.as_ref().map(|f| f.as_raw_fd());
        let fd_of = |t: Target| match t {
            Target::Log => log_fd,
            Target::Temp => temp_fd.expect("a temp file"),
        };
        let link = io_uring::squeue::Flags::IO_LINK;
        let n = batch.len();
        let mut sqes: ChainSqes = Default::default();
        let mut count = 0;
        let mut put = |e: io_uring::squeue::Entry| {
            sqes[count] = Some(e);
            count += 1;
        };
        for (i, step) in batch.steps().enumerate() {
            let ud = ring_io::encode(op, 0, step_code(step.kind()));
            let sqe = self.step_sqe(step, ud, &fd_of, buf);
            let last = i + 1 == n;
            put(if last { sqe } else { sqe.flags(link) });
            if let (0, Some(ts)) = (i, delay) {
                // Test-only (fault fsync_delay_ms): a timeout linked between
                // the write and the fdatasync; ETIME counts as success.
                put(opcode::Timeout::new(ts)
                    .flags(types::TimeoutFlags::ETIME_SUCCESS)
                    .build()
                    .flags(link)
                    .user_data(ring_io::encode(op, 0, STEP_DELAY)));
            }
        }
        (sqes, count)
    }

    /// The SQE of one of the planner's steps (`ud` its user_data), on the
    /// files `fd_of` names; a write's bytes from the lent chain buffer
    /// `(buf_ptr, buf_len)`.
    fn step_sqe(
        &self,
        step: Step,
        ud: u64,
        fd_of: &impl Fn(Target) -> RawFd,
        (buf_ptr, buf_len): (*const u8, usize),
    ) -> io_uring::squeue::Entry {
        match step {
            Step::Write {
                target,
                offset,
                at,
                len,
            } => {
                // A release assert: the pointer arithmetic rests on it.
                assert!(at + len <= buf_len, "a write past the chain's buffer");
                // SAFETY (pointer arithmetic): `at + len <= buf_len`
                // (asserted), so the pointer stays inside the lent chain
                // buffer, which the kernel owns until the chain's last
                // completion. Past it the kernel would copy whatever
                // follows the buffer into the log: records that fail their
                // CRC at replay, or another allocation's bytes on disk.
                // Resumed pieces start at `at > 0`: tests/wal_faults.rs
                // `short_writes_everywhere_lose_nothing` (a short write
                // every few writes, then a restart that must find every
                // key) fails on a wrong offset; the simulator (tests/sim)
                // checks the planner's ranges.
                let ptr = unsafe { buf_ptr.add(at) };
                opcode::Write::new(types::Fd(fd_of(target)), ptr, len as u32)
                    .offset(offset)
                    .build()
                    .user_data(ud)
            }
            Step::Sync { target } => opcode::Fsync::new(types::Fd(fd_of(target)))
                .flags(types::FsyncFlags::DATASYNC)
                .build()
                .user_data(ud),
            Step::Rename => {
                let paths = &self.files;
                opcode::RenameAt::new(
                    types::Fd(libc::AT_FDCWD),
                    paths.temp_path.as_ptr(),
                    types::Fd(libc::AT_FDCWD),
                    paths.path_c.as_ptr(),
                )
                .build()
                .user_data(ud)
            }
            Step::SyncDir => opcode::Fsync::new(types::Fd(self.files.dir_fd()))
                .build()
                .user_data(ud),
        }
    }
}
