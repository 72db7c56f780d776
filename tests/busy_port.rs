//! A second `ringlockd` on a port a live one listens on fails at once with
//! one line naming the holder, although `--bind-retry` (10 s by default)
//! would retry an address in use; a listener that no live process holds (a
//! `kill -9`ed predecessor's socket, still held by its io_uring while it
//! closes) is still waited for. Real `ringlockd` processes.

mod common;

use std::io::BufRead;
use std::io::BufReader;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Server;

#[test]
fn a_second_ringlockd_on_a_live_servers_port_fails_at_once_naming_it() {
    let first = Server::start(&[]);
    let lock = first.lock_addr.to_string();
    let admin = first.admin_addr.to_string();
    for (what, args) in [
        (
            "lock",
            ["--bind", lock.as_str(), "--admin-bind", "127.0.0.1:0"],
        ),
        (
            "admin",
            ["--bind", "127.0.0.1:0", "--admin-bind", admin.as_str()],
        ),
    ] {
        let started = Instant::now();
        // The default --bind-retry: 10 s of retries if it waited.
        let out = Command::new(env!("CARGO_BIN_EXE_ringlockd"))
            .args(args)
            .env_remove("BIND_ADDRESS")
            .env_remove("DATA_PATH")
            .output()
            .expect("run ringlockd");
        let took = started.elapsed();
        assert!(!out.status.success(), "{what}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
        assert!(
            err.starts_with(&format!("ringlockd: cannot bind {what} port "))
                && err.contains("Address already in use")
                && err.contains(&format!("pid {} (ringlockd) listens there", first.pid())),
            "{what}: {err}"
        );
        assert!(took < Duration::from_secs(3), "{what}: took {took:?}");
    }
}

#[test]
fn a_killed_predecessors_port_can_be_bound_again() {
    let mut first = Server::start(&[]);
    let lock = first.lock_addr.to_string();
    let _conns: Vec<_> = (0..4).map(|_| first.connect()).collect();
    first.kill9();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringlockd"));
    cmd.args(["--bind", lock.as_str(), "--admin-bind", "127.0.0.1:0"]);
    let second = Server::spawn(cmd, &[]).expect("binds the dead server's port");
    assert_eq!(second.lock_addr, first.lock_addr);
}

/// Sends `fd` over a unix socket pair (SCM_RIGHTS) and returns the pair:
/// until it is closed, the descriptor lives in the kernel only, in no
/// process's descriptor table.
fn park_in_flight(fd: RawFd) -> (OwnedFd, OwnedFd) {
    let mut pair = [-1; 2];
    // SAFETY: socketpair fills the two-element array.
    assert_eq!(
        unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        },
        0
    );
    // SAFETY: two fresh descriptors nobody else owns.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain data; every pointer set below points at a live
    // local (iov, control) that outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer has room for one header with one fd
    // (CMSG_SPACE above), so CMSG_FIRSTHDR is non-null and CMSG_DATA is
    // inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        assert_eq!(libc::sendmsg(a.as_raw_fd(), &msg, 0), 1);
    }
    (a, b)
}

#[test]
fn a_listener_that_no_live_process_holds_is_still_waited_for() {
    // A dying predecessor's io_uring holds its listener after the process
    // is gone. The same from the outside: a listening socket whose only
    // reference is in flight in a unix socket.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let parked = park_in_flight(listener.as_raw_fd());
    drop(listener);
    let mut child = Command::new(env!("CARGO_BIN_EXE_ringlockd"))
        .args(["--bind", addr.as_str(), "--admin-bind", "127.0.0.1:0"])
        .env_remove("BIND_ADDRESS")
        .env_remove("DATA_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ringlockd");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    // ringlockd gives up after its 10 s of retries, so these reads end.
    let mut line = String::new();
    let mut read = |what: &str| loop {
        line.clear();
        let n = err.read_line(&mut line).unwrap();
        assert!(n > 0, "ringlockd exited before {what}");
        if line.contains(what) {
            return line.clone();
        }
    };
    let retry = read("event=bind_retry");
    assert!(retry.contains(&format!("addr={addr}")), "{retry}");
    // The socket goes away (as the dead ring's does): ringlockd binds.
    drop(parked);
    let listening = read("event=listening");
    assert!(listening.contains(&format!("lock={addr}")), "{listening}");
    let _ = child.kill();
    let _ = child.wait();
}
