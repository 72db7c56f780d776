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

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ringlock::client::CancelToken;

use crate::{Fail, EX_CANNOT_EXEC, EX_NOT_FOUND, EX_SOFTWARE};

/// The child's pid while it runs (0 otherwise).
static CHILD_PID: AtomicI32 = AtomicI32::new(0);
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
        // A terminal's ^C (SI_KERNEL) already reached the child through the
        // foreground process group; sending it again would double it.
        if code != libc::SI_KERNEL {
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
    let (pid, kill_after) = (s.pid, s.kill_after);
    // SAFETY: plain syscall; `pid` is our unreaped child (module docs). If
    // it had been reaped, the pid could belong to an unrelated process by
    // now and the signal would hit it: the supervisor's mutex orders
    // "exited" before the reap. tests/cli_session.rs pins that a lost lock
    // stops the command (SIGTERM, and SIGKILL after --kill-after); no test
    // can provoke a pid reuse.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    s.signalled = true;
    let escalate = move || {
        let deadline = Instant::now() + kill_after;
        let mut s = sup();
        while s.pid == pid {
            let now = Instant::now();
            if now >= deadline {
                // SAFETY: as above: still unreaped while `s.pid == pid`.
                unsafe { libc::kill(pid, libc::SIGKILL) };
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
        unsafe { libc::kill(pid, libc::SIGKILL) };
        s.killed = true;
    }
}

/// Runs the command with the forwarded signals blocked on entry, `env`
/// added to its environment; returns its exit code (128+N for death by
/// signal N).
pub fn run_child(
    argv: &[std::ffi::OsString],
    env: &[(&str, std::ffi::OsString)],
) -> Result<u8, Fail> {
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    for (k, v) in env {
        command.env(k, v);
    }
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe calls (signal, pthread_sigmask) on locals; an
    // allocation or lock there could deadlock the forked child. Every
    // CLI test that runs a command goes through it (tests/cli.rs,
    // tests/cli_session.rs).
    unsafe {
        command.pre_exec(|| {
            // Our mask is inherited across exec (std does not reset it), and
            // a signal landing before exec must not run our handler in the
            // child: default dispositions first, then unblock.
            for sig in FORWARDED {
                libc::signal(sig, libc::SIG_DFL);
            }
            mask_signals(false);
            Ok(())
        });
    }
    let spawned = command.spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            mask_signals(false);
            let code = match e.kind() {
                io::ErrorKind::NotFound => EX_NOT_FOUND,
                _ => EX_CANNOT_EXEC,
            };
            return Err(Fail(code, format!("{}: {e}", argv[0].to_string_lossy())));
        }
    };
    let pid = child.id() as i32;
    CHILD_PID.store(pid, Ordering::SeqCst);
    {
        let mut s = sup();
        s.pid = pid;
        // Lost between the grant and now: stop it at once.
        if s.lost.is_some() {
            terminate(&mut s);
        }
    }
    mask_signals(false);
    // Wait without reaping, so the pid cannot be recycled while the handler
    // may still signal it; then forget it and reap.
    loop {
        // SAFETY: siginfo is plain data (all-zero is a valid value) that
        // the kernel fills in.
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
    // Exited but not reaped: after this nobody signals the pid again.
    sup().pid = 0;
    SUP_CHANGED.notify_all();
    CHILD_PID.store(0, Ordering::SeqCst);
    let status = child
        .wait()
        .map_err(|e| Fail(EX_SOFTWARE, format!("waiting for the command: {e}")))?;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => EX_SOFTWARE,
    })
}
