//! The classic failure of a lock without fencing, and the fence that
//! prevents it, against a real `ringlockd`.
//!
//! ```text
//! ringlockd &                                    # or any address:
//! cargo run --example fence                      # RINGLOCK_ADDR=HOST:PORT, or --addr HOST:PORT
//! cargo run --example fence -- --no-fence        # the same story, unprotected
//! ```
//!
//! This process plays the protected resource: a tiny store whose writes
//! pass through a [`ringlock::fence::Fence`]. The story:
//! 1. Holder A, a child process, takes a lease on a key (TTL `--ttl-ms`,
//!    default 300 ms, within the server's bounds) and keeps it alive with
//!    an Extend every third of the TTL from a second thread. It writes
//!    once with its token: accepted.
//! 2. A checks that its lease is still alive (an Extend answered `ok`) and
//!    is about to write again. Right then it is stopped with `SIGSTOP`: a
//!    pause (a stop-the-world collection, a swapped-out page, a VM
//!    migration) that also stops its extend thread.
//! 3. Holder B (this process) asks for the key; the server grants it the
//!    moment A's lease expires, with a larger token. B writes: accepted.
//! 4. A is continued (`SIGCONT`) and does the write it had checked for,
//!    with its old token. The fence refuses it: B's write stands.
//!
//! With `--no-fence` the store applies every write and A's stale write
//! lands over B's: two holders wrote, one of them after losing the lock.
//! The exit code is 0 when the stale write was refused, 1 when it was
//! applied, 2 on any other failure.
//!
//! The example speaks the session protocol directly
//! (`ringlock::protocol::session`, documented in `docs/protocol.md`,
//! "Sessions") over a `TcpStream`, so every step is visible here; an
//! application would use the client library's `Lease::token()` instead.
//! The same code runs in the test suite (`tests/fence_example.rs`) against
//! the real server binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringlock::fence::{Fence, Stale};
use ringlock::protocol::session::{
    decode_answer, encode, Answer, HoldMode, Req, Status, Welcome, VERSION,
};

/// The first argument that makes this program the holder child.
pub const HOLDER_ARG: &str = "--fence-example-holder";
/// Every socket read gives up after this long: a hung server fails the
/// example instead of stalling it.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// How long B waits in the server's queue for A's lease to expire.
const TAKEOVER_WAIT_MS: u32 = 30_000;

pub struct Options {
    pub addr: String,
    pub ttl_ms: u32,
    pub fence: bool,
}

/// What happened, for the caller (the example's `main`, or the test).
#[derive(Debug)]
pub struct Outcome {
    pub token_a: u64,
    pub token_b: u64,
    /// What the store answered A's write after the pause.
    pub stale_write: Result<(), Stale>,
    /// The store's writes, in the order it applied them.
    pub store: Vec<String>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(HOLDER_ARG) {
        std::process::exit(holder_main(&args[1..]));
    }
    let opts = match parse_args(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("fence: {e}\nusage: fence [--addr HOST:PORT] [--ttl-ms N] [--no-fence]");
            std::process::exit(2);
        }
    };
    match run(&opts, &mut |line| println!("{line}")) {
        Ok(o) if o.stale_write.is_err() => {
            println!("the paused holder's stale write was refused: the store is consistent");
        }
        Ok(_) => {
            println!("the paused holder's stale write was APPLIED over its successor's (no fence)");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("fence: {e}");
            std::process::exit(2);
        }
    }
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        addr: std::env::var("RINGLOCK_ADDR").unwrap_or_else(|_| "127.0.0.1:22119".into()),
        ttl_ms: 300,
        fence: true,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--addr" => o.addr = it.next().ok_or("--addr needs HOST:PORT")?.clone(),
            "--ttl-ms" => {
                o.ttl_ms = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&v| v > 0)
                    .ok_or("--ttl-ms needs a positive number of milliseconds")?
            }
            "--no-fence" => o.fence = false,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(o)
}

/// Runs the story against the server at `opts.addr`; `say` gets one line
/// per step.
pub fn run(opts: &Options, say: &mut dyn FnMut(String)) -> Result<Outcome, String> {
    // A key of this run only: nothing else contends for it.
    let key = format!("fence-example/{}", std::process::id());
    let (mut b, welcome) = Session::open(&opts.addr)?;
    let ttl_ms = opts.ttl_ms.clamp(welcome.min_ttl_ms, welcome.max_ttl_ms);
    say(format!(
        "ringlockd at {}: lease TTL {ttl_ms} ms (server bounds {}..={} ms)",
        opts.addr, welcome.min_ttl_ms, welcome.max_ttl_ms
    ));
    let fence = Fence::new();
    let mut store = Vec::new();
    let mut write = |token: u64, data: String| -> Result<(), Stale> {
        if opts.fence {
            fence.apply(token, || store.push(data))
        } else {
            store.push(data);
            Ok(())
        }
    };

    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut a = Holder::spawn(
        Command::new(exe)
            .arg(HOLDER_ARG)
            .arg(&opts.addr)
            .arg(&key)
            .arg(ttl_ms.to_string()),
    )?;
    // 1. A is granted and writes once.
    let token_a: u64 = a.expect("GRANTED")?.parse().map_err(|_| "bad token")?;
    say(format!(
        "holder A (pid {}): granted token {token_a}",
        a.pid()
    ));
    let (t, data) = a.expect_write()?;
    let r = write(t, data.clone());
    say(format!(
        "holder A writes {data:?} with token {t}: {}",
        verdict(&r)
    ));
    a.answer(&r)?;

    // 2. A checked its lease and is about to write: stop it right there.
    a.expect("CHECKED")?;
    a.stop()?;
    say("holder A: its lease is alive, it is about to write... SIGSTOP (a pause longer than its lease)".into());

    // 3. B takes over once A's lease expires.
    let waited = Instant::now();
    let token_b = b.acquire(&key, HoldMode::Session, 0, TAKEOVER_WAIT_MS)?;
    say(format!(
        "holder B: granted token {token_b} after {} ms in the queue (A's lease expired)",
        waited.elapsed().as_millis()
    ));
    if token_b <= token_a {
        return Err(format!(
            "token {token_b} of the new holder is not above {token_a}"
        ));
    }
    let data = format!("B: write with token {token_b}");
    let r = write(token_b, data.clone());
    say(format!("holder B writes {data:?}: {}", verdict(&r)));
    r.map_err(|e| format!("the current holder's write was refused: {e}"))?;

    // 4. A resumes and does the write it had checked for.
    a.resume()?;
    a.go()?;
    let (t, data) = a.expect_write()?;
    let stale_write = write(t, data.clone());
    say(format!(
        "holder A (continued) writes {data:?} with token {t}: {}",
        verdict(&stale_write)
    ));
    a.answer(&stale_write)?;
    if let Ok(lost) = a.expect("LOST") {
        say(format!("holder A then learns from the server: {lost}"));
    }
    a.finish()?;
    b.release(&key, token_b)?;
    Ok(Outcome {
        token_a,
        token_b,
        stale_write,
        store,
    })
}

fn verdict(r: &Result<(), Stale>) -> String {
    match r {
        Ok(()) => "accepted".into(),
        Err(e) => format!("REFUSED ({e})"),
    }
}

// ------------------------------------------------------------ holder A

/// The child: `HOLDER_ARG ADDR KEY TTL_MS`. Talks to the parent (the store)
/// in lines: it prints `GRANTED token`, `WRITE token data`, `CHECKED`,
/// `LOST why` and reads `OK` / `STALE` and `GO`.
pub fn holder_main(args: &[String]) -> i32 {
    match holder(args) {
        Ok(()) => 0,
        Err(e) => {
            println!("ERROR {e}");
            2
        }
    }
}

fn holder(args: &[String]) -> Result<(), String> {
    let [addr, key, ttl_ms] = args else {
        return Err(format!("holder arguments: ADDR KEY TTL_MS, got {args:?}"));
    };
    let ttl_ms: u32 = ttl_ms.parse().map_err(|_| "bad TTL")?;
    let (mut s, _) = Session::open(addr)?;
    let token = s.acquire(key, HoldMode::Lease, ttl_ms, 0)?;
    println!("GRANTED {token}");

    // The extend thread keeps the lease alive until the server refuses.
    let lost = Arc::new(AtomicBool::new(false));
    let (lost2, key2) = (lost.clone(), key.clone());
    let period = Duration::from_millis(u64::from(ttl_ms / 3).max(1));
    let extender = std::thread::spawn(move || loop {
        std::thread::sleep(period);
        match s.call(&Req::Extend {
            token,
            ttl_ms,
            key: key2.as_bytes(),
        }) {
            Ok((Status::Ok, _)) => {}
            Ok((st, _)) => {
                lost2.store(true, Ordering::SeqCst);
                return format!("the server answered the extend {}", st.name());
            }
            Err(e) => {
                lost2.store(true, Ordering::SeqCst);
                return e;
            }
        }
    });

    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut next = || -> Result<String, String> {
        lines
            .next()
            .ok_or("the store closed the pipe")?
            .map_err(|e| e.to_string())
    };
    println!("WRITE {token} A: write with token {token}");
    next()?;
    // The check that cannot protect anything: the lease is alive *now*.
    if lost.load(Ordering::SeqCst) {
        return Err("lost the lease before the second write".into());
    }
    println!("CHECKED");
    // The parent stops this process here; once continued it says GO.
    next()?;
    println!("WRITE {token} A: write with token {token}, after the pause");
    next()?;
    let why = extender.join().map_err(|_| "the extend thread panicked")?;
    println!("LOST {why}");
    Ok(())
}

struct Holder {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Holder {
    fn spawn(cmd: &mut Command) -> Result<Holder, String> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("start holder A: {e}"))?;
        let stdin = child.stdin.take().ok_or("holder stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("holder stdout")?);
        Ok(Holder {
            child,
            stdin,
            stdout,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The rest of A's next line, which must start with `word`.
    fn expect(&mut self, word: &str) -> Result<String, String> {
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| format!("holder A: {e}"))?;
        let line = line.trim_end();
        match line.split_once(' ').unwrap_or((line, "")) {
            (w, rest) if w == word => Ok(rest.to_string()),
            ("ERROR", why) => Err(format!("holder A failed: {why}")),
            _ if line.is_empty() => Err(format!("holder A exited before {word}")),
            _ => Err(format!("holder A said {line:?}, expected {word}")),
        }
    }

    fn expect_write(&mut self) -> Result<(u64, String), String> {
        let rest = self.expect("WRITE")?;
        let (t, data) = rest.split_once(' ').ok_or("WRITE without data")?;
        Ok((
            t.parse().map_err(|_| "bad token in WRITE")?,
            data.to_string(),
        ))
    }

    fn answer(&mut self, r: &Result<(), Stale>) -> Result<(), String> {
        let line = if r.is_ok() { "OK\n" } else { "STALE\n" };
        self.stdin
            .write_all(line.as_bytes())
            .map_err(|e| format!("to holder A: {e}"))
    }

    fn go(&mut self) -> Result<(), String> {
        self.stdin
            .write_all(b"GO\n")
            .map_err(|e| format!("to holder A: {e}"))
    }

    fn signal(&self, sig: libc::c_int) -> Result<(), String> {
        let pid = libc::pid_t::try_from(self.pid()).map_err(|_| "pid out of range")?;
        // SAFETY: kill(2) on our own, not yet reaped child (it is waited for
        // only in `finish` or the drop); once reaped, its pid could be reused
        // and the signal hit another process. tests/fence_example.rs runs
        // this pause and resume.
        if unsafe { libc::kill(pid, sig) } != 0 {
            return Err(format!("kill: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// SIGSTOP, and wait (bounded) until the kernel shows A stopped.
    fn stop(&mut self) -> Result<(), String> {
        self.signal(libc::SIGSTOP)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.state()? != 'T' {
            if Instant::now() > deadline {
                return Err("holder A did not stop".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn resume(&mut self) -> Result<(), String> {
        self.signal(libc::SIGCONT)
    }

    /// The process state letter from `/proc/PID/stat` (`T`: stopped).
    fn state(&self) -> Result<char, String> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .map_err(|e| format!("/proc stat of holder A: {e}"))?;
        // The state follows the parenthesised command name.
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .ok_or_else(|| format!("unreadable stat {stat:?}"))
    }

    fn finish(mut self) -> Result<(), String> {
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("holder A exited with {status}"));
        }
        Ok(())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // A failed run leaves no stopped child behind.
        let _ = self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------ session

/// One session connection, one request at a time.
struct Session {
    s: TcpStream,
    buf: Vec<u8>,
    next_rid: u32,
}

impl Session {
    fn open(addr: &str) -> Result<(Session, Welcome), String> {
        let s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| s.set_nodelay(true))
            .map_err(|e| e.to_string())?;
        let mut me = Session {
            s,
            buf: Vec::new(),
            next_rid: 2,
        };
        let mut out = Vec::new();
        encode(
            1,
            &Req::Hello {
                version: VERSION,
                keepalive_ms: 0,
                auth: b"",
            },
            &mut out,
        );
        me.s.write_all(&out).map_err(|e| format!("hello: {e}"))?;
        let answer = me.answer(Some(1)).map_err(|e| {
            format!("{addr} did not answer the Hello: {e} (does it speak the session protocol?)")
        })?;
        match answer {
            Answer::Welcome { welcome, .. } if welcome.status == Status::Ok => Ok((me, welcome)),
            other => Err(format!(
                "the server at {addr} refused the session: {other:?} (does it speak sessions?)"
            )),
        }
    }

    fn answer(&mut self, hello_rid: Option<u32>) -> Result<Answer, String> {
        loop {
            if let Some((a, n)) = decode_answer(&self.buf, hello_rid)? {
                self.buf.drain(..n);
                return Ok(a);
            }
            let mut chunk = [0u8; 512];
            match self.s.read(&mut chunk) {
                Ok(0) => return Err("the server closed the session".into()),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => return Err(format!("read: {e}")),
            }
        }
    }

    /// Sends `req` and returns its reply's status and token; Lost pushes
    /// in between are skipped (the reply tells the same story).
    fn call(&mut self, req: &Req<'_>) -> Result<(Status, u64), String> {
        let rid = self.next_rid;
        self.next_rid += 1;
        let mut out = Vec::new();
        encode(rid, req, &mut out);
        self.s.write_all(&out).map_err(|e| format!("send: {e}"))?;
        loop {
            match self.answer(None)? {
                Answer::Reply {
                    rid: r,
                    status,
                    token,
                    ..
                } if r == rid => return Ok((status, token)),
                Answer::Lost { .. } => {}
                other => return Err(format!("unexpected answer {other:?}")),
            }
        }
    }

    fn acquire(
        &mut self,
        key: &str,
        hold: HoldMode,
        ttl_ms: u32,
        wait_ms: u32,
    ) -> Result<u64, String> {
        match self.call(&Req::Acquire {
            hold,
            ttl_ms,
            wait_ms,
            key: key.as_bytes(),
            source: b"fence-example",
            access: ringlock::protocol::session::Access::Exclusive,
        })? {
            (Status::Ok, token) => Ok(token),
            (st, _) => Err(format!("acquire {key:?}: {}", st.name())),
        }
    }

    fn release(&mut self, key: &str, token: u64) -> Result<(), String> {
        match self.call(&Req::Release {
            token,
            key: key.as_bytes(),
        })? {
            (Status::Ok, _) => Ok(()),
            (st, _) => Err(format!("release {key:?}: {}", st.name())),
        }
    }
}
