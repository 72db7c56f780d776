//! Test support for the MySQL backend: a private `mariadbd` (its own data
//! directory, Unix socket and loopback port; started and stopped here,
//! nothing left running), a test user, checks from a second session, and a
//! fault-injecting TCP proxy (`proxy`).
//!
//! Nothing is left behind: every server is spawned from one long-lived
//! thread with `PR_SET_PDEATHSIG = SIGKILL`, so it dies with the test
//! process however that ends; the shared server's directory is removed by
//! an `atexit` hook, private servers' by their `Drop`.
//!
//! A missing `mariadbd` fails the test with the package to install; it is
//! never a skip.
#![allow(dead_code)]

pub mod proxy;

use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use mysql::{Conn, OptsBuilder, Pool, PoolConstraints, PoolOpts};

pub const USER: &str = "ringlock";
pub const PASSWORD: &str = "ringlock-test-pw";

/// How long any "this must happen" wait may take before the test fails.
/// Far above what anything here needs, so that only a hang trips it.
pub const LIVENESS: Duration = Duration::from_secs(60);

/// Polls `cond` until it holds; fails the test after [`LIVENESS`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + LIVENESS;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn find_tool(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    // mariadbd lives in sbin, which a non-root PATH often lacks.
    for extra in ["/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"] {
        dirs.push(PathBuf::from(extra));
    }
    names
        .iter()
        .flat_map(|n| dirs.iter().map(move |d| d.join(n)))
        .find(|p| p.is_file())
}

fn tools() -> (PathBuf, PathBuf) {
    let server = find_tool(&["mariadbd", "mysqld"]);
    let install = find_tool(&["mariadb-install-db", "mysql_install_db"]);
    match (server, install) {
        (Some(s), Some(i)) => (s, i),
        _ => panic!(
            "mariadbd / mariadb-install-db not found: the MySQL backend's tests need a real \
             MariaDB server. Install the Debian package `mariadb-server` \
             (apt-get install mariadb-server); .ci/run does."
        ),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Spawns every server from one thread that lives as long as the process,
/// because `PR_SET_PDEATHSIG` fires when the *spawning thread* exits.
fn spawn_for_life(cmd: Command) -> Child {
    type Req = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Req>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Req>();
        std::thread::Builder::new()
            .name("mariadb-parent".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    // SAFETY: prctl in the child between fork and exec only
                    // sets a flag on the child itself.
                    unsafe {
                        cmd.pre_exec(|| {
                            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                            Ok(())
                        });
                    }
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static: this loop never ends, and
                // neither does this thread, until the process exits.
            })
            .expect("spawn the mariadb parent thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    tx.lock()
        .expect("spawner lock")
        .send((cmd, reply_tx))
        .expect("spawner thread alive");
    reply_rx
        .recv()
        .expect("spawner answered")
        .expect("spawn mariadbd")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A private MariaDB server.
pub struct MariaDb {
    pub port: u16,
    pub dir: PathBuf,
    pub socket: PathBuf,
    child: Mutex<Option<Child>>,
}

impl MariaDb {
    /// One server shared by every test of this test binary (tests use keys
    /// of their own). Statements are logged to `mysql.general_log`, so a
    /// test can count what the library sent.
    pub fn shared() -> &'static MariaDb {
        static SHARED: OnceLock<MariaDb> = OnceLock::new();
        static ONCE: std::sync::Once = std::sync::Once::new();
        let db = SHARED.get_or_init(|| MariaDb::start_with(true));
        ONCE.call_once(|| {
            extern "C" fn cleanup() {
                if let Some(db) = SHARED.get() {
                    db.stop();
                }
            }
            // SAFETY: registers a plain function; it runs at exit(3), which
            // is how the test harness ends (also after a failed test).
            unsafe {
                libc::atexit(cleanup);
            }
        });
        db
    }

    /// A server of the test's own (for tests that kill it).
    pub fn start() -> MariaDb {
        MariaDb::start_with(false)
    }

    fn start_with(general_log: bool) -> MariaDb {
        let (server, install) = tools();
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ringlock-mariadb-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the server directory");
        let data = dir.join("data");
        let mut cmd = Command::new(&install);
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db");
        if is_root() {
            cmd.arg("--user=root");
        }
        let mut out = cmd.output().expect("run mariadb-install-db");
        if !out.status.success() {
            // Seen once in a full suite run on a busy machine: the bootstrap
            // server failed to start. Show why, then try once more from an
            // empty data directory; a second failure fails the test.
            let log = std::fs::read_dir(&data)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "err"))
                .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                .collect::<Vec<_>>()
                .join("\n");
            eprintln!(
                "mariadb-install-db failed once, retrying:\n{}{}{log}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let _ = std::fs::remove_dir_all(&data);
            out = cmd.output().expect("run mariadb-install-db");
        }
        assert!(
            out.status.success(),
            "mariadb-install-db failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let socket = dir.join("sock");
        let log = dir.join("err.log");
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).expect("create the server's tmpdir");
        for _attempt in 0..5 {
            let port = free_port();
            let mut cmd = Command::new(&server);
            cmd.arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--port={port}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--pid-file={}", dir.join("pid").display()))
                .arg(format!("--log-error={}", log.display()))
                // Its temporary files in its own directory, where no
                // other server or process can touch them.
                .arg(format!("--tmpdir={}", tmp.display()))
                .arg("--skip-log-bin")
                .arg("--skip-name-resolve")
                .arg("--innodb-buffer-pool-size=16M")
                .arg("--max-connections=500")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if general_log {
                cmd.arg("--general-log=1").arg("--log-output=TABLE");
            }
            if is_root() {
                cmd.arg("--user=root");
            }
            let child = spawn_for_life(cmd);
            let db = MariaDb {
                port,
                dir: dir.clone(),
                socket: socket.clone(),
                child: Mutex::new(Some(child)),
            };
            match db.wait_ready(&log) {
                Ok(()) => {
                    db.create_user();
                    return db;
                }
                Err(text) if text.contains("already in use") || text.contains("Bind on") => {
                    db.kill9_keep_dir();
                    continue;
                }
                Err(text) => {
                    db.stop();
                    panic!("mariadbd did not start:\n{text}");
                }
            }
        }
        panic!("mariadbd found no free port in 5 attempts");
    }

    fn wait_ready(&self, log: &Path) -> Result<(), String> {
        let end = Instant::now() + LIVENESS;
        loop {
            if let Some(status) = self
                .child
                .lock()
                .expect("child lock")
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                return Err(format!("exited with {status}; log:\n{text}"));
            }
            if Conn::new(self.root_opts()).is_ok() {
                return Ok(());
            }
            if Instant::now() > end {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                return Err(format!("not ready after {LIVENESS:?}; log:\n{text}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn create_user(&self) {
        let mut root = self.root();
        root.query_drop(format!(
            "CREATE USER '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'"
        ))
        .expect("create the test user");
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child
            .lock()
            .expect("child lock")
            .as_ref()
            .map(|c| c.id())
            .expect("server running")
    }

    /// Root over the Unix socket: the second session that checks what the
    /// library did.
    pub fn root_opts(&self) -> OptsBuilder {
        OptsBuilder::new()
            .socket(Some(self.socket.to_string_lossy().into_owned()))
            .user(Some("root"))
            .prefer_socket(true)
    }

    pub fn root(&self) -> Conn {
        Conn::new(self.root_opts()).expect("root connection over the socket")
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The test user over TCP to `addr` (the server or a proxy in front of
    /// it), with the settings the library recommends (see `pool_opts`).
    pub fn opts_via(&self, addr: SocketAddr) -> OptsBuilder {
        OptsBuilder::new()
            .ip_or_hostname(Some(addr.ip().to_string()))
            .tcp_port(addr.port())
            .user(Some(USER))
            .pass(Some(PASSWORD))
            .prefer_socket(false)
            .tcp_connect_timeout(Some(Duration::from_secs(10)))
            .read_timeout(Some(Duration::from_secs(10)))
            .write_timeout(Some(Duration::from_secs(10)))
    }

    /// A pool through `addr` opening connections on demand, at most `max`.
    pub fn pool_via(&self, addr: SocketAddr, max: usize) -> Pool {
        let constraints = PoolConstraints::new(0, max).expect("0 <= max");
        Pool::new(
            self.opts_via(addr)
                .pool_opts(PoolOpts::default().with_constraints(constraints)),
        )
        .expect("a lazy pool opens nothing")
    }

    pub fn pool(&self) -> Pool {
        self.pool_via(self.addr(), 20)
    }

    /// `mysql://USER:PASSWORD@127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("mysql://{USER}:{PASSWORD}@127.0.0.1:{}", self.port)
    }

    /// The session holding `key` (IS_USED_LOCK), from a second session.
    pub fn holder(&self, key: &str) -> Option<u64> {
        self.root()
            .exec_first::<Option<u64>, _, _>("SELECT IS_USED_LOCK(?)", (key,))
            .expect("IS_USED_LOCK")
            .flatten()
    }

    /// IS_FREE_LOCK, from a second session.
    pub fn is_free(&self, key: &str) -> bool {
        self.root()
            .exec_first::<i64, _, _>("SELECT IS_FREE_LOCK(?)", (key,))
            .expect("IS_FREE_LOCK")
            == Some(1)
    }

    /// How many statements containing `needle` the server logged (shared
    /// server only: it runs with the general log on).
    pub fn logged(&self, needle: &str) -> u64 {
        self.root()
            .exec_first::<u64, _, _>(
                "SELECT COUNT(*) FROM mysql.general_log \
                 WHERE command_type = 'Query' AND LOCATE(?, argument) > 0",
                (needle,),
            )
            .expect("count the general log")
            .unwrap_or(0)
    }

    /// How many times exactly `stmt` was logged (shared server only).
    pub fn logged_exact(&self, stmt: &str) -> u64 {
        self.root()
            .exec_first::<u64, _, _>(
                "SELECT COUNT(*) FROM mysql.general_log \
                 WHERE command_type = 'Query' AND argument = ?",
                (stmt,),
            )
            .expect("count the general log")
            .unwrap_or(0)
    }

    /// The sessions that run a statement containing `needle` and wait in a
    /// user lock.
    ///
    /// Read with `SHOW FULL PROCESSLIST` and filtered here: a query on
    /// `information_schema.PROCESSLIST` materialises its LONGTEXT `Info`
    /// column in an on-disk Aria temporary table, and one CI run saw that
    /// table's file vanish under the server ("Error on delete of
    /// '/tmp/#sql-temptable-…'"), failing a test that had nothing wrong.
    pub fn waiting(&self, needle: &str) -> Vec<u64> {
        let rows: Vec<mysql::Row> = self
            .root()
            .query("SHOW FULL PROCESSLIST")
            .expect("read the process list");
        rows.into_iter()
            .filter_map(|row| {
                let id: u64 = row.get("Id")?;
                let state: Option<String> = row.get("State")?;
                let info: Option<String> = row.get("Info")?;
                (state.as_deref() == Some("User lock") && info.is_some_and(|i| i.contains(needle)))
                    .then_some(id)
            })
            .collect()
    }

    /// Waits until a session other than those in `seen` waits in
    /// `GET_LOCK` for `key`; its id.
    pub fn wait_waiting_new(&self, key: &str, seen: &[u64]) -> u64 {
        let needle = format!("GET_LOCK('{key}'");
        let mut id = None;
        wait_until(&format!("a session waits for {key}"), || {
            id = self
                .waiting(&needle)
                .into_iter()
                .find(|i| !seen.contains(i));
            id.is_some()
        });
        id.expect("waited for it")
    }

    /// Waits until a session waits in `GET_LOCK` for `key`; its id.
    pub fn wait_waiting(&self, key: &str) -> u64 {
        self.wait_waiting_new(key, &[])
    }

    /// Kills the server with SIGKILL.
    pub fn kill9(&self) {
        if let Some(child) = self.child.lock().expect("child lock").as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn kill9_keep_dir(&self) {
        self.kill9();
        *self.child.lock().expect("child lock") = None;
    }

    fn stop(&self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A session of the test's own holding `key` (a plain driver connection).
pub struct Holder {
    pub conn: Conn,
}

impl Holder {
    pub fn take(db: &MariaDb, key: &str) -> Holder {
        let mut conn = Conn::new(db.opts_via(db.addr())).expect("holder connection");
        let got: Option<i64> = conn
            .exec_first("SELECT GET_LOCK(?, 10)", (key,))
            .expect("holder GET_LOCK");
        assert_eq!(got, Some(1), "the holder got {key}");
        Holder { conn }
    }

    pub fn id(&self) -> u64 {
        u64::from(self.conn.connection_id())
    }

    pub fn release(&mut self, key: &str) {
        let r: Option<i64> = self
            .conn
            .exec_first("SELECT RELEASE_LOCK(?)", (key,))
            .expect("holder RELEASE_LOCK");
        assert_eq!(r, Some(1), "the holder released {key}");
    }
}

/// A key no other test uses.
pub fn key(tag: &str) -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    format!(
        "t-{tag}-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}
