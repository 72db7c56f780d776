//! The driver's system calls outside the ring: binding the listeners
//! (backlog, port retry), the peer of an accepted socket, fitting the
//! descriptor limit, blocking signals into a signalfd, refusing a socket
//! with a plain `send`, the CPU affinity mask and pinning, and the clocks.
//! Each wraps libc; every `unsafe` block here is one call on memory this
//! thread owns.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::RawFd;

use crate::config::Config;
use crate::core::Now;
use crate::log::Level;

/// The answer sent to connections refused over the limit.
pub(super) static REFUSED: [u8; 1] = [b'-'];

pub(super) fn now() -> Now {
    let mut mono = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let mut wall = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointers to stack timespecs; these clocks always exist.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut mono);
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut wall);
    }
    Now {
        mono_us: mono.tv_sec as u64 * 1_000_000 + mono.tv_nsec as u64 / 1000,
        unix_ms: wall.tv_sec as u64 * 1000 + wall.tv_nsec as u64 / 1_000_000,
    }
}

/// The listen backlog: the kernel's cap (`net.core.somaxconn`), so a burst
/// of connections after a stall waits in the queue, not on SYN retries.
fn backlog() -> i32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(4096)
}

/// Binds a listener. After `kill -9`, the dead process's io_uring may keep
/// its listener bound for a while (the ring's file references are dropped
/// asynchronously): an address in use is retried for `retry_ms`, unless a
/// live process listens there (`port_owner`: another ringlockd, any
/// server), which waiting would not change: that fails at once. With
/// `reuse_port` every shard binds its own listener on the same address
/// (SO_REUSEPORT) and the kernel spreads connections over them.
pub(super) fn listen(
    addr: SocketAddr,
    what: &str,
    retry_ms: u64,
    reuse_port: bool,
    first: bool,
) -> io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let started = std::time::Instant::now();
    let mut logged = false;
    let mut looked = false;
    let sock = loop {
        let attempt = (|| {
            if reuse_port && addr.port() != 0 && first {
                // SO_REUSEPORT would let us join the port group of a dying
                // predecessor's listener (kept alive by its io_uring after
                // kill -9), which would then reset the connections the
                // kernel hands it. A plain bind first proves the port free.
                let probe = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
                probe.set_reuse_address(true)?;
                probe.bind(&addr.into())?;
            }
            let sock = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
            sock.set_reuse_address(true)?;
            if reuse_port {
                sock.set_reuse_port(true)?;
            }
            // Accepted sockets inherit TCP_NODELAY from the listener on
            // Linux: our one-byte answers must never wait for Nagle.
            sock.set_tcp_nodelay(true)?;
            sock.set_cloexec(true)?;
            sock.bind(&addr.into())?;
            sock.listen(backlog())?;
            Ok::<_, io::Error>(sock)
        })();
        match attempt {
            Ok(s) => break s,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && !looked => {
                looked = true;
                if let Some(who) = super::port_owner::live_listener(addr) {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("cannot bind {what} port {addr}: {e}: {who}"),
                    ));
                }
                // Nobody alive holds it: retried below, on the next turn.
            }
            Err(e)
                if e.kind() == io::ErrorKind::AddrInUse
                    && started.elapsed().as_millis() < retry_ms as u128 =>
            {
                if !logged {
                    logged = true;
                    log!(
                        Level::Warn,
                        "bind_retry",
                        "port={} addr={} reason=\"address in use; retrying for up to {} ms (a crashed predecessor's socket may still be closing)\"",
                        what,
                        addr,
                        retry_ms
                    );
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => {
                let waited = if logged {
                    format!(" (still in use after retrying for {retry_ms} ms)")
                } else {
                    String::new()
                };
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot bind {what} port {addr}: {e}{waited}"),
                ));
            }
        }
    };
    Ok(sock.into())
}

pub(super) fn peer_of(fd: RawFd) -> SocketAddr {
    // SAFETY: sockaddr_storage is large enough for any address family; the
    // kernel writes at most `len` bytes.
    unsafe {
        let mut ss: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getpeername(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) != 0 {
            return SocketAddr::from(([0, 0, 0, 0], 0));
        }
        match ss.ss_family as i32 {
            libc::AF_INET => {
                let a = &*(&ss as *const _ as *const libc::sockaddr_in);
                SocketAddr::from((
                    u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                    u16::from_be(a.sin_port),
                ))
            }
            libc::AF_INET6 => {
                let a = &*(&ss as *const _ as *const libc::sockaddr_in6);
                SocketAddr::from((a.sin6_addr.s6_addr, u16::from_be(a.sin6_port)))
            }
            _ => SocketAddr::from(([0, 0, 0, 0], 0)),
        }
    }
}

/// Every connection is a file descriptor: raise the soft RLIMIT_NOFILE to
/// what `max_connections` needs (up to the hard limit), and lower
/// `max_connections` with a warning when the hard limit is smaller, so the
/// server refuses connections cleanly (`-`) instead of failing accepts.
pub(super) fn fit_fd_limit(cfg: &mut Config) {
    // Listeners, signalfd, log, directory, temp file, metrics, stdio, and
    // a ring, per shard. `max_connections` counts every shard's.
    const RESERVED: u64 = 64;
    let shards = cfg.threads.max(1) as u64;
    let want = (cfg.max_connections + cfg.admin_connections) as u64 + RESERVED * shards;
    // SAFETY: get/setrlimit on a stack struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return;
        }
        if r.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want.min(r.rlim_max),
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = raised.rlim_cur;
            }
        }
        if r.rlim_cur < want {
            let fit = r.rlim_cur.saturating_sub(RESERVED * shards).max(1) as usize;
            log!(
                Level::Warn,
                "limit_lowered",
                "limit=max_connections from={} to={} reason=\"RLIMIT_NOFILE is {}\"",
                cfg.max_connections,
                fit,
                r.rlim_cur
            );
            cfg.max_connections = fit;
        }
    }
}

pub(super) fn block_signals() -> io::Result<RawFd> {
    // SAFETY: plain signal-mask manipulation on a zeroed set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        // SIGHUP re-reads the certificates (`--certs-dir`).
        libc::sigaddset(&mut set, libc::SIGHUP);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

/// Answers `-` (best effort) and closes a socket no shard will serve.
pub(super) fn refuse_fd(fd: RawFd) {
    // SAFETY: `fd` is an open socket this thread owns and no op references;
    // one static byte.
    unsafe {
        libc::send(
            fd,
            REFUSED.as_ptr() as *const libc::c_void,
            1,
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        );
        libc::close(fd);
    }
}

/// The CPUs this process may run on (its affinity mask), in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity writes at most size_of::<cpu_set_t>() bytes
    // into the zeroed set on the stack.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return vec![0];
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        if cpus.is_empty() {
            vec![0]
        } else {
            cpus
        }
    }
}

pub(super) fn pin_to(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t with one bit set, passed by pointer.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}
