//! Signals and the child command of `lock` / `try-lock`.
//!
//! While a lock wait is in progress, SIGINT/SIGTERM/SIGHUP cancel it through
//! the wait's [`CancelToken`] (exact withdrawal, exit 128+N). While the
//! command runs they are forwarded to it; a terminal's ^C already reached it
//! through the process group and is not sent twice. Everything the handler
//! touches is an atomic, so it is async-signal-safe.
//!
//! A lost lock ([`lock_lost`], called from the session's lost-lock
//! handler) sends SIGTERM to the command, and SIGKILL `--kill-after` later
//! if it still runs. The pid is valid for both: the command is waited for
//! without being reaped (`WNOWAIT`), and the supervisor's mutex orders "it
//! exited" before the reap and before any later SIGKILL, so a signal never
//! reaches a recycled pid. A loss that lands before the command started is
//! acted on when it starts ([`run_child`] registers it under the same
//! mutex).
//!
//! # The command never outlives ringlock's hold
//! flock(1)'s lock lives as long as any process holds its descriptor, so
//! `kill -9` of flock cannot let a second holder in while the first
//! command runs. Here the lock lives in a connection (a ringlockd session,
//! a MySQL session) that the server frees when it sees it close, and the
//! kernel closes a dying process's descriptors *before* it signals that
//! process's children (`do_exit`: files first, the parent-death signal
//! later). So "the command dies with ringlock" alone would race the
//! server's grant to the next waiter. Three things, together:
//!
//! 1. **The command inherits the lock's connection** (`keep_fds`, from
//!    [`ringlock::lease::Lease::connection_fd`]: `FD_CLOEXEC` is cleared in
//!    the child only). A socket is closed (FIN: the server ends the session
//!    and frees the lock) when its *last* descriptor is closed, so
//!    ringlock's death alone closes nothing: the connection ends when the
//!    command, and every process that inherited the descriptor from it, are
//!    gone. This is what orders "the command is dead" before "the lock is
//!    free": the kernel's own rule, as for flock(1). It does not keep the
//!    lock past the session's keep-alive deadline (nobody pings once
//!    ringlock is dead), so the command must also die:
//! 2. **The command gets SIGKILL when ringlock dies**:
//!    `PR_SET_PDEATHSIG(SIGKILL)`, set between fork and exec. It fires when
//!    the *thread* that forked exits, so the command is started from the
//!    main thread (which lives as long as the process); and ringlock may
//!    have died before the `prctl`, so the child compares `getppid()` with
//!    ringlock's pid after it and does not exec if they differ. The kernel
//!    clears it when the command execs a set-user-ID/set-group-ID or
//!    file-capability program (`sudo`, `ping`): then only 3. kills it.
//! 3. **Its children die too** (a shell's commands: `sh -c 'step1; step2'`
//!    is `sh` and its children): unless ringlock runs in the foreground of
//!    a terminal, the command runs in a process group of its own, led by a
//!    *warden*: a child of ringlock forked before the command, which does
//!    nothing but wait on a pipe whose only writer is ringlock. A byte means
//!    "the command ended, stand down"; end of file means ringlock died
//!    without saying so (any signal, `kill -9` included): the warden sends
//!    SIGKILL to the whole group, itself included. The warden holds copies
//!    of ringlock's connections too (it is a fork of it), so they end no
//!    earlier than that kill. It ignores the terminal's and the usual
//!    termination signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, ...);
//!    only a SIGKILL of the warden itself defeats 3.
//!
//! In a terminal's foreground (`tcgetpgrp` of fd 0, 1 or 2 is ringlock's
//! group) the command stays in ringlock's process group, so that the
//! terminal's ^C and ^Z reach it and it may read the terminal; then only
//! the first two apply: the command itself is killed, and a process it
//! started keeps the lock while it holds the inherited descriptor, but only
//! until the server's keep-alive deadline passes (it is not killed). With
//! its own group, a signal from the terminal (SI_KERNEL: the job was
//! brought to the foreground later) is forwarded to the whole group, as the
//! terminal would have done; a lost lock's SIGTERM and SIGKILL go to the
//! whole group too.
//!
//! Processes the command leaves running *after it exits normally* are not
//! covered: the lock is released when the command itself exits (unlike
//! flock(1), whose inherited descriptor would keep it); see docs/client.md.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ringlock::client::CancelToken;

use crate::exit::{Fail, EX_CANNOT_EXEC, EX_NOT_FOUND, EX_SOFTWARE};

/// The child's pid while it runs (0 otherwise).
static CHILD_PID: AtomicI32 = AtomicI32::new(0);
/// The child's process group while it runs in one of its own (the
/// warden's pid), 0 when it shares ringlock's.
static CHILD_PGID: AtomicI32 = AtomicI32::new(0);
/// The cancel token's eventfd while a lock wait is in progress (-1 otherwise).
pub static CANCEL_FD: AtomicI32 = AtomicI32::new(-1);
/// The last forwarded-or-cancelling signal received.
static GOT_SIGNAL: AtomicI32 = AtomicI32::new(0);

const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

pub fn got_signal() -> i32 {
    GOT_SIGNAL.load(Ordering::SeqCst)
}

extern "C" fn on_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // Async-signal-safe only: atomics, kill(2), write(2).
    GOT_SIGNAL.store(sig, Ordering::SeqCst);
    let pid = CHILD_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: installed with SA_SIGINFO (install_handlers), so the
        // kernel passes a valid siginfo; without that flag `info` could be
        // garbage and this read would fault. tests/cli.rs
        // (sigterm_is_forwarded_…) runs this handler.
        let code = unsafe { (*info).si_code };
        let pgid = CHILD_PGID.load(Ordering::SeqCst);
        // A terminal's ^C (SI_KERNEL) already reached the child through the
        // foreground process group; sending it again would double it. In a
        // group of its own the child did not get it: the whole group gets
        // it, as from the terminal (the warden ignores it).
        if code == libc::SI_KERNEL {
            if pgid > 0 {
                // SAFETY: plain syscall; the group is led by the warden, an
                // unreaped child of ours (run_child clears CHILD_PGID before
                // it reaps it), so the id cannot name another group.
                unsafe { libc::kill(-pgid, sig) };
            }
        } else {
            // SAFETY: plain syscall; `pid` is an unreaped child (run_child
            // clears CHILD_PID before it reaps). Were it reaped, the pid could
            // be reused and the signal hit an unrelated process; no test can
            // provoke the reuse, tests/cli.rs (sigterm_is_forwarded_…) and
            // tests/cli_session.rs pin the forwarding itself.
            unsafe { libc::kill(pid, sig) };
        }
    } else {
        let fd = CANCEL_FD.load(Ordering::SeqCst);
        if fd >= 0 {
            CancelToken::cancel_fd(fd);
        }
    }
}

pub fn install_handlers() -> Result<(), Fail> {
    for sig in FORWARDED {
        // SAFETY: a zeroed sigaction is valid; we set the handler and flags
        // and pass pointers to live locals. A handler registered without
        // SA_SIGINFO would be called with a bogus `info` (see on_signal).
        // tests/cli.rs (sigterm_is_forwarded_…) fails if it is not
        // installed: the signal would kill the CLI, not reach the child.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(Fail(
                EX_SOFTWARE,
                format!("sigaction: {}", io::Error::last_os_error()),
            ));
        }
    }
    Ok(())
}

/// Blocks (or unblocks) the forwarded signals in this thread.
pub fn mask_signals(block: bool) {
    // SAFETY: builds a sigset on the stack and passes it to pthread_sigmask,
    // which only reads it. Leaving a signal blocked would stop forwarding
    // (tests/cli.rs sigterm_is_forwarded_… and tests/cli_session.rs's
    // SIGTERM test would hang until their timeout).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        let how = if block {
            libc::SIG_BLOCK
        } else {
            libc::SIG_UNBLOCK
        };
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// What the supervisor knows about the command and the lock.
struct Sup {
    /// The running command (0: not started, or exited).
    pid: i32,
    /// Where a lost lock's signals go: minus the group for a command in a
    /// group of its own, else its pid.
    target: i32,
    /// Why the lock was lost (the line to print), once it was.
    lost: Option<String>,
    kill_after: Duration,
    /// The loss reached a running command (it got SIGTERM).
    signalled: bool,
    /// SIGKILL was needed.
    killed: bool,
}

static SUP: Mutex<Sup> = Mutex::new(Sup {
    pid: 0,
    target: 0,
    lost: None,
    kill_after: Duration::from_secs(10),
    signalled: false,
    killed: false,
});
static SUP_CHANGED: Condvar = Condvar::new();

fn sup() -> MutexGuard<'static, Sup> {
    // Plain assignments only: a poisoned lock still holds consistent state.
    SUP.lock().unwrap_or_else(|p| p.into_inner())
}

/// The lock is gone: stop the command (SIGTERM now, SIGKILL `kill_after`
/// later). Called once, from the lost-lock handler; returns at once.
pub fn lock_lost(line: String, kill_after: Duration) {
    let mut s = sup();
    if s.lost.is_some() {
        return;
    }
    s.lost = Some(line);
    s.kill_after = kill_after;
    if s.pid > 0 {
        terminate(&mut s);
    }
}

/// What became of a lost lock.
pub struct Lost {
    /// Why (one line).
    pub line: String,
    /// It was lost while the command ran: the command got SIGTERM.
    pub signalled: bool,
    /// The command outlived `--kill-after` and got SIGKILL.
    pub killed: bool,
}

/// The loss, once the lock was lost.
pub fn lost() -> Option<Lost> {
    let s = sup();
    s.lost.clone().map(|line| Lost {
        line,
        signalled: s.signalled,
        killed: s.killed,
    })
}

/// SIGTERM to the running command, and a thread that sends SIGKILL if it
/// has not exited `kill_after` later.
fn terminate(s: &mut Sup) {
    let (pid, target, kill_after) = (s.pid, s.target, s.kill_after);
    // SAFETY: plain syscall; `pid` is our unreaped child (module docs). If
    // it had been reaped, the pid could belong to an unrelated process by
    // now and the signal would hit it: the supervisor's mutex orders
    // "exited" before the reap. tests/cli_session.rs pins that a lost lock
    // stops the command (SIGTERM, and SIGKILL after --kill-after); no test
    // can provoke a pid reuse. A negative `target` is the group the warden
    // leads, and the warden is unreaped while `s.pid` is set.
    unsafe { libc::kill(target, libc::SIGTERM) };
    s.signalled = true;
    let escalate = move || {
        let deadline = Instant::now() + kill_after;
        let mut s = sup();
        while s.pid == pid {
            let now = Instant::now();
            if now >= deadline {
                // SAFETY: as above: still unreaped while `s.pid == pid`.
                unsafe { libc::kill(target, libc::SIGKILL) };
                s.killed = true;
                return;
            }
            s = SUP_CHANGED
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    };
    if std::thread::Builder::new()
        .name("ringlock-kill-after".into())
        .spawn(escalate)
        .is_err()
    {
        // Without a timer the command could outlive its lock for good.
        // SAFETY: as above.
        unsafe { libc::kill(target, libc::SIGKILL) };
        s.killed = true;
    }
}

/// Whether ringlock runs in the foreground process group of a terminal
/// (one of fds 0 to 2): then the command stays in ringlock's group, so that
/// the terminal's signals reach it and it may read the terminal.
fn in_terminal_foreground() -> bool {
    (0..=2).any(|fd| {
        // SAFETY: plain queries on a descriptor number, no memory: a closed
        // or non-terminal one just answers no. Answered wrongly "foreground",
        // the command would share the CLI's group and its children outlive
        // a kill -9: tests/cli_kill.rs (no terminal) checks they die.
        unsafe { libc::isatty(fd) == 1 && libc::tcgetpgrp(fd) == libc::getpgrp() }
    })
}

/// The warden of a command that runs in a process group of its own (the
/// module docs, 3.): a forked child of ringlock that leads the group and
/// kills it when ringlock dies.
struct Warden {
    pid: libc::pid_t,
    /// The pipe's only write end: a byte stands the warden down; its close
    /// without one (ringlock died) makes the warden kill the group.
    tell: OwnedFd,
}

impl Warden {
    /// Forks the warden; its pid is the new group's id. Call with the
    /// forwarded signals blocked (the warden ignores them once it runs).
    fn start() -> io::Result<Warden> {
        let mut fds = [-1; 2];
        // SAFETY: pipe2 fills the two-element array it is given (a shorter
        // one would be written past its end). tests/cli_kill.rs starts a
        // warden through this pipe in every round.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: two fresh descriptors that nothing else owns; owned twice,
        // one would be closed under another user (a double close).
        // tests/cli_kill.rs: the warden sees the CLI die through them.
        let (read, tell) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: a fork of a multi-threaded process: the child runs only
        // `watch`, which makes async-signal-safe calls and never returns
        // (nothing is dropped or allocated in it). tests/cli_kill.rs runs it.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            watch(fds[0], fds[1]);
        }
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(read);
        let warden = Warden { pid, tell };
        // The warden does it too: whichever runs first, the group exists
        // before the command joins it.
        // SAFETY: plain syscall on our own child, which never execs (after
        // an exec setpgid fails, and the command would not be in a group the
        // warden kills: tests/cli_kill.rs's rounds catch survivors).
        if unsafe { libc::setpgid(pid, pid) } != 0 {
            let e = io::Error::last_os_error();
            warden.stand_down();
            return Err(e);
        }
        Ok(warden)
    }

    /// The command ended (or never started): the warden exits without
    /// killing anything, and is reaped.
    fn stand_down(self) {
        // SAFETY: a one-byte write from a live buffer on our own pipe. It
        // fails (EPIPE; SIGPIPE is ignored by Rust's runtime) only if the
        // warden is dead already (a lost lock's SIGKILL to the group).
        // Without the byte the warden would kill a command that exited
        // normally's leftovers: tests/cli.rs's command tests stand it down.
        unsafe { libc::write(self.tell.as_raw_fd(), b"x".as_ptr().cast(), 1) };
        drop(self.tell);
        loop {
            let mut status = 0;
            // SAFETY: reaps our own child; `status` is a live out-parameter
            // (a dangling one would be written by the kernel). Unreaped, the
            // warden stays a zombie; tests/cli_kill.rs runs it every round.
            let rc = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if rc >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }
}

/// The warden's whole life, in the forked child: async-signal-safe calls
/// only (the parent's other threads may hold locks the fork copied).
fn watch(read: RawFd, tell: RawFd) -> ! {
    // SAFETY: close, signal, setpgid, read, kill and _exit are
    // async-signal-safe, and only touch locals: in this forked child of a
    // multi-threaded process an allocation or lock could deadlock it, and
    // then nothing kills the command when the CLI dies. tests/cli_kill.rs
    // (50 rounds of kill -9) fails if the warden does not act.
    unsafe {
        // Only ringlock may hold the write end, or its death would go
        // unseen.
        libc::close(tell);
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGTSTP,
            libc::SIGTTIN,
            libc::SIGTTOU,
            libc::SIGPIPE,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        libc::setpgid(0, 0);
        let mut byte = 0u8;
        loop {
            let n = libc::read(read, (&mut byte as *mut u8).cast(), 1);
            if n == 1 {
                libc::_exit(0);
            }
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break;
        }
        // End of file: ringlock died while the command ran. The group is
        // this process, the command and whatever it started there.
        libc::kill(0, libc::SIGKILL);
        libc::_exit(0)
    }
}

/// Runs the command with the forwarded signals blocked on entry, `env`
/// added to its environment and the descriptors `keep_fds` (the lock's
/// connection) inherited; returns its exit code (128+N for death by signal
/// N). The command dies with ringlock (module docs); this thread must live
/// until it returns, which it does by waiting for the command.
pub fn run_child(
    argv: &[std::ffi::OsString],
    env: &[(&str, std::ffi::OsString)],
    keep_fds: &[RawFd],
) -> Result<u8, Fail> {
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    for (k, v) in env {
        command.env(k, v);
    }
    let warden = if in_terminal_foreground() {
        None
    } else {
        Some(
            Warden::start()
                .map_err(|e| Fail(EX_SOFTWARE, format!("starting the command's warden: {e}")))?,
        )
    };
    let pgid = warden.as_ref().map_or(0, |w| w.pid);
    // SAFETY: plain syscall, no memory; a wrong pid would make the child's
    // parent-death check (getppid after prctl) misjudge a live CLI as dead
    // and kill every command: each command test of tests/cli.rs would fail.
    let parent = unsafe { libc::getpid() };
    set_up_before_exec(&mut command, pgid, parent, keep_fds);
    let spawned = command.spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            if let Some(w) = warden {
                w.stand_down();
            }
            mask_signals(false);
            let code = match e.kind() {
                io::ErrorKind::NotFound => EX_NOT_FOUND,
                _ => EX_CANNOT_EXEC,
            };
            return Err(Fail(code, format!("{}: {e}", argv[0].to_string_lossy())));
        }
    };
    let pid = child.id() as i32;
    CHILD_PGID.store(pgid, Ordering::SeqCst);
    CHILD_PID.store(pid, Ordering::SeqCst);
    {
        let mut s = sup();
        s.pid = pid;
        s.target = if pgid > 0 { -pgid } else { pid };
        // Lost between the grant and now: stop it at once.
        if s.lost.is_some() {
            terminate(&mut s);
        }
    }
    mask_signals(false);
    wait_unreaped(pid);
    // Exited but not reaped: after this nobody signals the pid (or the
    // warden's group) again.
    forget_child();
    let status = child.wait();
    // What the command left running in its group is not killed: the lock
    // is released when the command itself ends (docs/client.md).
    if let Some(w) = warden {
        w.stand_down();
    }
    let status = status.map_err(|e| Fail(EX_SOFTWARE, format!("waiting for the command: {e}")))?;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => EX_SOFTWARE,
    })
}

/// What the forked child does before exec: default dispositions for the
/// forwarded signals and an empty mask, the warden's group `pgid` (if
/// any), death with ringlock (whose pid is `parent`) and `keep_fds`
/// inherited.
fn set_up_before_exec(command: &mut Command, pgid: i32, parent: i32, keep_fds: &[RawFd]) {
    let keep = keep_fds.to_vec();
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (signal, pthread_sigmask, setpgid, prctl,
    // getppid, fcntl) on locals and on `keep`, allocated before the fork;
    // an allocation or lock there could deadlock the forked child. Every
    // CLI test that runs a command goes through it (tests/cli.rs,
    // tests/cli_session.rs, tests/cli_kill.rs).
    unsafe {
        command.pre_exec(move || {
            // Our mask is inherited across exec (std does not reset it), and
            // a signal landing before exec must not run our handler in the
            // child: default dispositions first, then unblock.
            for sig in FORWARDED {
                libc::signal(sig, libc::SIG_DFL);
            }
            mask_signals(false);
            if pgid > 0 && libc::setpgid(0, pgid) != 0 {
                return Err(io::Error::last_os_error());
            }
            // Dies when ringlock does (the forking thread, which waits for
            // this child); and if ringlock is gone already, before exec.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            for &fd in &keep {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC);
                }
            }
            Ok(())
        });
    }
}

/// Forgets the command (exited, not yet reaped): the handler and the
/// supervisor no longer signal its pid or group.
fn forget_child() {
    {
        let mut s = sup();
        s.pid = 0;
        s.target = 0;
    }
    SUP_CHANGED.notify_all();
    CHILD_PID.store(0, Ordering::SeqCst);
    CHILD_PGID.store(0, Ordering::SeqCst);
}

/// Waits for the command `pid` to exit, without reaping it.
fn wait_unreaped(pid: i32) {
    // Without reaping, so the pid cannot be recycled while the handler may
    // still signal it; the caller then forgets it and reaps.
    loop {
        // SAFETY: siginfo is plain data (all-zero is a valid value) that
        // the kernel fills in; a type with invalid zero patterns would be
        // undefined behaviour here. The command tests of tests/cli.rs read
        // its exit status from it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits on our own child; `info` is a live out-parameter
        // the kernel writes. Reaping here instead (no WNOWAIT) would let
        // the pid be reused while on_signal may still signal it; the
        // command tests of tests/cli.rs and tests/cli_session.rs run it.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            break; // child.wait() below reports it.
        }
    }
}
