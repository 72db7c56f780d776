//! Socket helpers (connecting is [`super::stream`]'s): bounded reads, waiting with a deadline and a cancel
//! token, liveness peeks and TCP keepalive. Everything here is a thin,
//! blocking wrapper over std and `libc::poll`/`recv`/`setsockopt`.

use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

use crate::cancel::CancelToken;
use std::time::{Duration, Instant};

/// Why [`wait_readable`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    Readable,
    Deadline,
    Cancelled,
}

/// Waits until `sock` has data, EOF or an error to report, the deadline
/// passes, or the token is cancelled. Cancellation wins over readability so
/// that a caller's decision is always routed through exact cancellation.
pub(crate) fn wait_readable(
    sock: &super::stream::Stream,
    deadline: Option<Instant>,
    cancel: Option<&CancelToken>,
) -> io::Result<Wake> {
    if sock.buffered() && !cancel.is_some_and(CancelToken::is_cancelled) {
        // TLS plaintext already decrypted: the socket may stay quiet.
        return Ok(Wake::Readable);
    }
    loop {
        let timeout_ms: libc::c_int = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(Wake::Deadline);
                }
                // Round up so we never wake early and spin.
                let ms = left.as_micros().div_ceil(1000);
                ms.min(libc::c_int::MAX as u128) as libc::c_int
            }
        };
        let mut fds = [
            libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: cancel.map_or(-1, |c| c.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a live array of 2 pollfds; a negative fd is
        // ignored by poll(2).
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if fds[1].revents & libc::POLLIN != 0 {
            return Ok(Wake::Cancelled);
        }
        if fds[0].revents != 0 {
            return Ok(Wake::Readable);
        }
    }
}

/// Sleeps for `delay` unless the token is cancelled first.
pub(crate) fn pause(delay: Duration, cancel: Option<&CancelToken>) -> bool {
    let Some(token) = cancel else {
        std::thread::sleep(delay);
        return true;
    };
    let deadline = Instant::now() + delay;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        let mut pfd = libc::pollfd {
            fd: token.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd on the stack.
        if unsafe { libc::poll(&mut pfd, 1, ms) } > 0 {
            return false;
        }
    }
}

/// A usable socket timeout (std rejects zero).
pub(crate) fn nonzero(d: Duration) -> Duration {
    d.max(Duration::from_millis(1))
}

/// Reads one byte within `timeout`. `Ok(None)` is EOF.
pub(crate) fn read_byte(
    sock: &mut super::stream::Stream,
    timeout: Duration,
) -> io::Result<Option<u8>> {
    sock.set_read_timeout(Some(nonzero(timeout)))?;
    let mut b = [0u8; 1];
    loop {
        match sock.read(&mut b) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(b[0])),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// True when the connection looks usable for a new request: no EOF, no
/// error and no stray bytes are pending. A peer that vanished without a FIN
/// is not detected here (that is what the I/O timeout is for).
pub(crate) fn looks_alive(sock: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: reads at most 1 byte into a live stack buffer.
    let rc = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    rc < 0 && io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock
}

/// Turns on TCP keepalive so a lock wait on a silently dead path fails in
/// about `idle + 3 * idle/3` instead of hanging forever.
pub(crate) fn set_keepalive(sock: &TcpStream, idle: Duration) -> io::Result<()> {
    let idle_s = idle.as_secs().clamp(1, 32_767) as libc::c_int;
    let interval_s = (idle_s / 3).max(1);
    let opts = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_s),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval_s),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ];
    for (level, name, value) in opts {
        // SAFETY: passes a pointer to a live c_int and its exact size.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::stream::Stream;
    use std::io::Write;
    use std::net::TcpListener;

    #[test]
    fn cancel_token_wakes_a_wait_and_stays_cancelled() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = Stream::plain(TcpStream::connect(l.local_addr().unwrap()).unwrap());
        let token = CancelToken::new().unwrap();
        assert!(!token.is_cancelled());
        let far = Some(Instant::now() + Duration::from_secs(30));
        let t2 = token.clone();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            t2.cancel();
        });
        assert_eq!(
            wait_readable(&c, far, Some(&token)).unwrap(),
            Wake::Cancelled
        );
        h.join().unwrap();
        assert!(token.is_cancelled());
        assert!(!pause(Duration::from_secs(30), Some(&token)));
    }

    #[test]
    fn wait_reports_deadline_then_data_and_liveness() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = Stream::plain(TcpStream::connect(l.local_addr().unwrap()).unwrap());
        let (mut s, _) = l.accept().unwrap();
        let soon = Some(Instant::now() + Duration::from_millis(10));
        assert_eq!(wait_readable(&c, soon, None).unwrap(), Wake::Deadline);
        assert!(looks_alive(c.tcp()));
        s.write_all(b"+").unwrap();
        assert_eq!(wait_readable(&c, None, None).unwrap(), Wake::Readable);
        assert!(!looks_alive(c.tcp()), "stray byte pending");
        assert_eq!(
            read_byte(&mut c, Duration::from_secs(1)).unwrap(),
            Some(b'+')
        );
        drop(s);
        assert_eq!(read_byte(&mut c, Duration::from_secs(1)).unwrap(), None);
        assert!(!looks_alive(c.tcp()));
        set_keepalive(c.tcp(), Duration::from_secs(15)).unwrap();
    }
}
