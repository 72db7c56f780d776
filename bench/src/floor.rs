//! `floor-server`: the benchmark's floor. It speaks the Locking-Center frame
//! format on the same I/O mechanism as ringlockd (one thread, io_uring,
//! multishot accept, recv, send) and answers `+` to every complete frame —
//! no lock table, no queues, no durability. Whatever latency a lock server
//! shows above this floor is the cost of its locking; what the floor shows
//! is the cost of the kernel, loopback TCP and the load generator.
//!
//! Invariants:
//! - `user_data` = `kind << 56 | gen << 32 | slot` (0 unused); a CQE whose
//!   generation does not match the slot's current one is stale and ignored.
//! - A connection's buffers belong to the kernel while its recv or send is
//!   in flight; the slot is freed (and its fd closed) only when neither is.
//! - Bad input answers `-` and closes, as docs/protocol.md says.
//! - `--close-first`: a connection that did not open with Persist (action 6)
//!   carries one request; the floor answers it and then closes the
//!   connection itself (the FIN follows the answer), as ringlockd and the
//!   original Locking-Center do, so TIME_WAIT stays on the server side.
//!   Bytes after that one request are answered with one `-`, then it closes.
//!   Without the flag every connection is persistent and the client closes.

use std::io;
use std::net::TcpListener;
use std::os::fd::AsRawFd;

use io_uring::{cqueue, opcode, types, IoUring};
use ringlock_bench::frame::{frame_len, Frame};

const KIND_ACCEPT: u64 = 1;
const KIND_RECV: u64 = 2;
const KIND_SEND: u64 = 3;
const RECV_BYTES: usize = 4096;
const MAX_CONNECTIONS: usize = 65536;

struct Conn {
    fd: i32,
    gen: u32,
    recv_buf: Box<[u8; RECV_BYTES]>,
    /// Bytes of an incomplete frame carried over between recvs.
    pending: Vec<u8>,
    /// Reply bytes owned by the in-flight send (`send_pos..` not yet sent).
    send_buf: Vec<u8>,
    send_pos: usize,
    /// Replies produced while a send was in flight.
    queued: Vec<u8>,
    recv_in_flight: bool,
    send_in_flight: bool,
    /// Stop reading; close once the last send completes.
    closing: bool,
    /// Opened with Persist: several requests (close-first mode only).
    persistent: bool,
    /// Close-first mode: the one request of a one-shot connection is answered.
    answered: bool,
}

fn user_data(kind: u64, gen: u32, slot: usize) -> u64 {
    kind << 56 | (gen as u64 & 0xFF_FFFF) << 32 | slot as u64
}

struct Server {
    ring: IoUring,
    listen_fd: i32,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    next_gen: u32,
    close_first: bool,
}

/// Action Persist: the connection carries several requests.
const ACTION_PERSIST: u8 = 6;

impl Server {
    fn push(&mut self, sqe: io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every buffer referenced by a pushed SQE lives in a boxed
            // or heap buffer of a slot that is not freed while the op is in flight.
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    fn arm_accept(&mut self) -> io::Result<()> {
        let sqe = opcode::AcceptMulti::new(types::Fd(self.listen_fd))
            .build()
            .user_data(user_data(KIND_ACCEPT, 0, 0));
        self.push(sqe)
    }

    fn arm_recv(&mut self, slot: usize) -> io::Result<()> {
        let c = self.conns[slot]
            .as_mut()
            .expect("recv armed on a live slot");
        c.recv_in_flight = true;
        let sqe = opcode::Recv::new(types::Fd(c.fd), c.recv_buf.as_mut_ptr(), RECV_BYTES as u32)
            .build()
            .user_data(user_data(KIND_RECV, c.gen, slot));
        self.push(sqe)
    }

    fn arm_send(&mut self, slot: usize) -> io::Result<()> {
        let c = self.conns[slot]
            .as_mut()
            .expect("send armed on a live slot");
        if c.send_pos >= c.send_buf.len() {
            c.send_buf.clear();
            c.send_pos = 0;
            std::mem::swap(&mut c.send_buf, &mut c.queued);
            if c.send_buf.is_empty() {
                return Ok(());
            }
        }
        c.send_in_flight = true;
        let rest = &c.send_buf[c.send_pos..];
        let sqe = opcode::Send::new(types::Fd(c.fd), rest.as_ptr(), rest.len() as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(user_data(KIND_SEND, c.gen, slot));
        self.push(sqe)
    }

    fn maybe_free(&mut self, slot: usize) {
        let done = matches!(&self.conns[slot], Some(c) if c.closing && !c.recv_in_flight && !c.send_in_flight);
        if done {
            let c = self.conns[slot].take().expect("checked above");
            // SAFETY: no op references this fd or its buffers any more.
            unsafe { libc::close(c.fd) };
            self.free.push(slot);
        }
    }

    fn on_accept(&mut self, res: i32, flags: u32) -> io::Result<()> {
        if !cqueue::more(flags) {
            self.arm_accept()?;
        }
        if res < 0 {
            let err = io::Error::from_raw_os_error(-res);
            match -res {
                libc::EINTR | libc::EAGAIN | libc::ECONNABORTED | libc::EMFILE | libc::ENFILE => {
                    eprintln!("event=accept_error err={err}");
                    return Ok(());
                }
                _ => return Err(io::Error::new(err.kind(), format!("accept: {err}"))),
            }
        }
        let fd = res;
        let one: libc::c_int = 1;
        // SAFETY: fd is a freshly accepted socket; `one` outlives the call.
        unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.conns.len() < MAX_CONNECTIONS => {
                self.conns.push(None);
                self.conns.len() - 1
            }
            None => {
                // SAFETY: fd is ours and unused.
                unsafe { libc::close(fd) };
                return Ok(());
            }
        };
        self.next_gen = self.next_gen.wrapping_add(1) & 0xFF_FFFF;
        self.conns[slot] = Some(Conn {
            fd,
            gen: self.next_gen,
            recv_buf: Box::new([0; RECV_BYTES]),
            pending: Vec::new(),
            send_buf: Vec::with_capacity(64),
            send_pos: 0,
            queued: Vec::with_capacity(64),
            recv_in_flight: false,
            send_in_flight: false,
            closing: false,
            persistent: false,
            answered: false,
        });
        self.arm_recv(slot)
    }

    fn on_recv(&mut self, slot: usize, res: i32) -> io::Result<()> {
        let c = self.conns[slot]
            .as_mut()
            .expect("generation matched a live slot");
        c.recv_in_flight = false;
        if res == -libc::EINTR || res == -libc::EAGAIN {
            return self.arm_recv(slot);
        }
        if res <= 0 {
            // EOF, ECONNRESET or another error: the peer is gone.
            c.closing = true;
            self.maybe_free(slot);
            return Ok(());
        }
        let n = res as usize;
        c.pending.extend_from_slice(&c.recv_buf[..n]);
        let close_first = self.close_first;
        let mut at = 0;
        let mut replies = 0usize;
        let mut bad = false;
        // A one-shot connection (close-first mode) serves nothing after its
        // one request.
        while !c.answered {
            match frame_len(&c.pending[at..]) {
                Frame::Complete(len) => {
                    if close_first && !c.persistent {
                        if c.pending[at] == ACTION_PERSIST {
                            c.persistent = true;
                        } else {
                            c.answered = true;
                        }
                    }
                    at += len;
                    replies += 1;
                }
                Frame::Incomplete => break,
                Frame::Invalid => {
                    bad = true;
                    break;
                }
            }
        }
        c.pending.drain(..at);
        c.queued.extend(std::iter::repeat_n(b'+', replies));
        if bad || (c.answered && !c.pending.is_empty()) {
            c.queued.push(b'-');
            c.closing = true;
        } else if c.answered {
            // The FIN follows the answer: close once it is sent.
            c.closing = true;
        }
        let sending = c.send_in_flight;
        let closing = c.closing;
        if !sending {
            self.arm_send(slot)?;
        }
        if !closing {
            self.arm_recv(slot)?;
        }
        self.maybe_free(slot);
        Ok(())
    }

    fn on_send(&mut self, slot: usize, res: i32) -> io::Result<()> {
        let c = self.conns[slot]
            .as_mut()
            .expect("generation matched a live slot");
        c.send_in_flight = false;
        if res == -libc::EINTR || res == -libc::EAGAIN {
            return self.arm_send(slot);
        }
        if res < 0 {
            c.closing = true;
            self.maybe_free(slot);
            return Ok(());
        }
        // Short sends are normal: advance and send the rest.
        c.send_pos += res as usize;
        self.arm_send(slot)?;
        self.maybe_free(slot);
        Ok(())
    }

    fn run(&mut self) -> io::Result<()> {
        self.arm_accept()?;
        let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(1024);
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if e.raw_os_error() == Some(libc::EINTR)
                        || e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => return Err(e),
            }
            cqes.clear();
            cqes.extend(
                self.ring
                    .completion()
                    .map(|e| (e.user_data(), e.result(), e.flags())),
            );
            for &(ud, res, flags) in &cqes {
                let kind = ud >> 56;
                let gen = (ud >> 32) as u32 & 0xFF_FFFF;
                let slot = ud as u32 as usize;
                if kind == KIND_ACCEPT {
                    self.on_accept(res, flags)?;
                    continue;
                }
                let live = matches!(self.conns.get(slot), Some(Some(c)) if c.gen == gen);
                if !live {
                    continue;
                }
                match kind {
                    KIND_RECV => self.on_recv(slot, res)?,
                    KIND_SEND => self.on_send(slot, res)?,
                    other => panic!("unknown op kind {other} in user_data {ud:#x}"),
                }
            }
        }
    }
}

fn main() {
    let mut bind = "127.0.0.1:22129".to_string();
    let mut close_first = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bind" => bind = args.next().unwrap_or_else(|| usage()),
            "--close-first" => close_first = true,
            _ => usage(),
        }
    }
    let listener = TcpListener::bind(&bind).unwrap_or_else(|e| {
        eprintln!("error: bind {bind}: {e}");
        std::process::exit(1)
    });
    let local = listener
        .local_addr()
        .expect("a bound listener has an address");
    let ring = IoUring::builder()
        .setup_cqsize(8192)
        .build(1024)
        .unwrap_or_else(|e| {
            eprintln!("error: io_uring setup: {e}");
            std::process::exit(1)
        });
    eprintln!("event=listening lock={local} server=floor close_first={close_first}");
    let mut server = Server {
        ring,
        listen_fd: listener.as_raw_fd(),
        conns: Vec::new(),
        free: Vec::new(),
        next_gen: 0,
        close_first,
    };
    if let Err(e) = server.run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: floor-server [--bind IP:PORT] [--close-first]\n  \
         answers '+' to every Locking-Center frame; --close-first: a connection \
         without Persist (action 6) is closed by the server after its one answer"
    );
    std::process::exit(2)
}
