//! Start-up: [`Server::bind`] recovers the logs, binds every shard's
//! listeners and blocks the signals; [`Server::run`] starts one thread per
//! shard (pinned to a CPU of the affinity mask when there are several),
//! each building its ring and [`Loop`] on that thread and publishing its
//! ring fd to the others before any of them runs. What the shard threads
//! share is built here once, as one [`Shared`] (see [`super::mesh`]), from
//! the metrics registry the caller gives.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use super::certs::Certs;
use super::clienttls_state::ClientTls;
use super::event_loop::Loop;
use super::faults::Faults;
use super::logio_state::LogIo;
use super::mesh::{self, MeshEnd, Shared};
use super::poll;
use super::ring::build_ring;
use super::sys::{allowed_cpus, block_signals, fit_fd_limit, listen, now, pin_to};
use crate::config::Config;
use crate::core::Table;
use crate::log::Level;
use crate::metrics::Metrics;
use crate::shard::Shard;
use crate::wal::log::Log;
use crate::wal::{self, LogFiles};

/// What one shard starts with: its listeners, its recovered table and log.
struct ShardStart {
    lock: TcpListener,
    admin: TcpListener,
    table: Table,
    log: Option<(LogFiles, Log)>,
    faults: Faults,
    /// Cluster mode: the shard's replica, its log file, its Raft listener
    /// and the other nodes' link addresses for this shard.
    raft: Option<RaftStart>,
    /// The lock and admin addresses this node tells clients (Locate,
    /// `CADR`).
    advertised: (String, String),
}

struct RaftStart {
    part: crate::shard::raft::GroupReplica,
    files: LogFiles,
    listener: TcpListener,
    peers: Vec<(u64, SocketAddr)>,
    hello: crate::cluster::wire::Hello,
}

/// The server before it runs: logs recovered, every shard's listeners
/// bound, signals blocked. [`Server::run`] starts one event loop per shard.
pub struct Server {
    cfg: Config,
    /// What the shard threads share (the budget, the connection count,
    /// the metrics, the certificates, a cluster node's view, the rings).
    shared: Arc<Shared>,
    parts: Vec<ShardStart>,
    signal_fd: RawFd,
    lock_addr: SocketAddr,
    admin_addr: SocketAddr,
    cpus: Vec<usize>,
}

impl Server {
    /// Recovers the logs (durable mode), binds both ports for every shard
    /// and blocks SIGINT/SIGTERM (threads started afterwards inherit the
    /// mask); nothing is served yet. The ports are bound only after every
    /// log is replayed: while recovery runs a client is refused (and
    /// retries) instead of waiting in the listen backlog for an unknown
    /// time, and nothing can be answered from a partial table
    /// (tests/scale.rs watches the start-up).
    pub fn bind(cfg: Config, metrics: Arc<Metrics>) -> io::Result<Server> {
        Server::bind_cluster(cfg, metrics, None)
    }

    /// [`Server::bind`] for a cluster node (`cluster` given): every shard a
    /// replica of its group, its log a cluster log (see
    /// [`crate::cluster::store`]), its Raft listener bound.
    pub fn bind_cluster(
        mut cfg: Config,
        metrics: Arc<Metrics>,
        cluster: Option<crate::cluster::ClusterConfig>,
    ) -> io::Result<Server> {
        let cpus = allowed_cpus();
        if cfg.threads == 0 {
            cfg.threads = cpus.len();
        }
        fit_fd_limit(&mut cfg);
        let n = cfg.threads;
        if metrics.shards() < n {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the metrics registry has {} loop slots for {n} shards",
                    metrics.shards()
                ),
            ));
        }
        let limits = crate::core::Limits {
            max_keys: cfg.max_keys,
            max_waiters: cfg.max_waiters,
        };
        let certs = load_certs(&cfg, cluster.as_ref(), &metrics)?;
        let shared = Shared::new(n, limits, cluster.is_some(), metrics, certs);
        let metrics = &shared.metrics;
        let mut tables: Vec<Table> = (0..n)
            .map(|_| Table::with_budget(shared.budget.clone()))
            .collect();
        let logs = recover_logs(&cfg, cluster.as_ref(), &mut tables, metrics)?;
        let (mut parts, lock_addr, admin_addr) = bind_shards(&cfg, tables, logs)?;
        let advertised = (
            advertise(cluster.as_ref(), lock_addr).to_string(),
            advertise(cluster.as_ref(), admin_addr).to_string(),
        );
        for p in &mut parts {
            p.advertised = advertised.clone();
        }
        if let Some(c) = &cluster {
            let view = shared.view.as_ref().expect("a cluster node's view");
            open_cluster(&cfg, c, &mut parts, advertise(Some(c), lock_addr), view)?;
            metrics.enable_raft(c.node_id, &c.voters(), n);
        }
        let signal_fd = block_signals()?;
        Ok(Server {
            cfg,
            shared,
            parts,
            signal_fd,
            lock_addr,
            admin_addr,
            cpus,
        })
    }

    pub fn lock_addr(&self) -> SocketAddr {
        self.lock_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The configuration in force (limits may have been fitted at bind).
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Serves until SIGINT/SIGTERM: shard 0 on the calling thread, every
    /// other shard on a thread of its own, each pinned to one CPU of the
    /// affinity mask. Returns after every shard answered its queued
    /// waiters `-`.
    pub fn run(mut self) -> io::Result<()> {
        let n = self.parts.len();
        if n > self.cpus.len() && self.cfg.idle_poll_us > 0 {
            // A polling shard would take turns with the others on its CPU.
            log!(
                Level::Info,
                "idle_poll_off",
                "shards={} cpus={} reason=\"shards share CPUs\"",
                n,
                self.cpus.len()
            );
            self.cfg.idle_poll_us = 0;
        }
        let mut meshes: Vec<Option<MeshEnd>> = if n > 1 {
            mesh::build(n).into_iter().map(Some).collect()
        } else {
            vec![None]
        };
        let pin = n > 1;
        let mut handles = Vec::new();
        let mut parts = self.parts.into_iter().enumerate();
        let (_, first) = parts.next().expect("at least one shard");
        for (i, part) in parts {
            let cfg = self.cfg.clone();
            let shared = self.shared.clone();
            let mesh = meshes[i].take();
            let cpu = self.cpus[i % self.cpus.len()];
            let h = std::thread::Builder::new()
                .name(format!("ringlock-shard-{i}"))
                .spawn(move || run_shard(i, n, cpu, pin, cfg, shared, part, mesh, None))?;
            handles.push(h);
        }
        let cpu = self.cpus[0];
        let mesh = meshes[0].take();
        let mut result = run_shard(
            0,
            n,
            cpu,
            pin,
            self.cfg,
            self.shared,
            first,
            mesh,
            Some(self.signal_fd),
        );
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a shard thread panicked")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    }
}

/// Builds shard `i`'s loop on this thread (the ring must be created by the
/// thread that submits to it) and runs it.
#[allow(clippy::too_many_arguments)] // the parts of one shard, moved in once
fn run_shard(
    i: usize,
    n: usize,
    cpu: usize,
    pin: bool,
    cfg: Config,
    shared: Arc<Shared>,
    part: ShardStart,
    mesh: Option<MeshEnd>,
    signal_fd: Option<RawFd>,
) -> io::Result<()> {
    let pinned = pin && pin_to(cpu);
    let built = Loop::new(i, n, cfg, shared.clone(), part, mesh, signal_fd);
    // Everyone publishes its ring (or that it has none) before anyone runs:
    // a doorbell needs the target's ring fd.
    let fd = built.as_ref().map_or(-2, |l| l.ring.as_raw_fd());
    let all_started = shared.start(i, fd);
    let mut lp = built?;
    if !all_started {
        return Err(io::Error::other("another shard failed to start"));
    }
    log!(
        Level::Info,
        "shard_start",
        "shard={} of={} cpu={} pinned={}",
        i,
        n,
        cpu,
        pinned
    );
    lp.run()
}

impl Loop {
    #[allow(clippy::too_many_arguments)] // the parts of one shard, moved in once
    fn new(
        index: usize,
        n: usize,
        cfg: Config,
        shared: Arc<Shared>,
        part: ShardStart,
        mesh: Option<MeshEnd>,
        signal_fd: Option<RawFd>,
    ) -> io::Result<Loop> {
        let ring = build_ring(cfg.max_connections, n)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot create io_uring: {e}")))?;
        let cap = cfg.max_connections.min(65_536);
        let prealloc = cfg.wal_preallocate_bytes;
        let (log, log_io, raft) = match (part.log, part.raft) {
            (Some((files, log)), _) => (
                Some(log),
                Some(LogIo::new(files, part.faults, prealloc)),
                None,
            ),
            (None, Some(r)) => {
                let io = LogIo::new(r.files, part.faults, prealloc);
                let view = shared.certs.as_ref().map(|c| c.view());
                let peers = super::peer::links::Peers::new(r.listener, r.peers, &r.hello, view);
                (None, Some(io), Some((r.part, peers)))
            }
            (None, None) => (None, None, None),
        };
        let idle_poll_us = cfg.idle_poll_us;
        let client_tls = shared
            .certs
            .as_ref()
            .map(|c| ClientTls::new(c.view(), cfg.client_cert_auth, cfg.frame_timeout_ms));
        let mut shard = Shard::new(cfg, part.table, log, shared.metrics.clone(), now());
        shard.place(index, n, shared.conns.clone());
        shard.advertise(part.advertised.0, part.advertised.1);
        let peers = raft.map(|(replica, peers)| {
            shard.enable_cluster(replica);
            peers
        });
        Ok(Loop {
            ring,
            lock_listener: part.lock,
            admin_listener: part.admin,
            signal_fd,
            // SAFETY: signalfd_siginfo is plain old data; all-zero is valid.
            signal_buf: Box::new(unsafe { std::mem::zeroed() }),
            conns: Vec::with_capacity(cap),
            shard,
            log: log_io,
            cqes: Vec::with_capacity(4096),
            cmds: Vec::with_capacity(1024),
            landings: Vec::with_capacity(2),
            closed: Vec::with_capacity(1024),
            stop_requested: false,
            mesh,
            shared,
            inbox: Vec::new(),
            idle_poll_us,
            poll: poll::PollWindow::new(idle_poll_us),
            peers,
            client_tls,
        })
    }
}

/// `--certs-dir`'s certificates (loaded, their expiry published), none
/// for a single node without them or a cluster started `--insecure`;
/// refuses a cluster node with neither, and `--insecure` where it means
/// nothing or contradicts `--certs-dir`.
fn load_certs(
    cfg: &Config,
    cluster: Option<&crate::cluster::ClusterConfig>,
    metrics: &Metrics,
) -> io::Result<Option<Arc<Certs>>> {
    let certs = match (&cfg.certs_dir, cluster) {
        (Some(dir), c) => {
            let node = c.as_ref().map(|c| c.node_id);
            let certs = Certs::load(dir.clone(), node)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            metrics.security.enable(false);
            metrics
                .security
                .set_cert_not_after_s(certs.not_after_unix_s());
            log!(
                Level::Info,
                "certs_loaded",
                "dir={} node={:?} not_after_unix_s={}",
                crate::log::path(dir),
                node,
                certs.not_after_unix_s()
            );
            Some(certs)
        }
        (None, Some(_)) if cfg.insecure => {
            metrics.security.enable(true);
            None
        }
        (None, Some(_)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster node (--peers) needs certificates: make them with `ringlock cert \
                 create-ca` and `ringlock cert create-node` and give --certs-dir DIR \
                 (docs/security.md), or start every node with --insecure to run the cluster \
                 open to anyone who can reach its Raft ports",
            ));
        }
        (None, None) => None,
    };
    if cfg.insecure && (cluster.is_none() || cfg.certs_dir.is_some()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            if cluster.is_none() {
                "--insecure is for a cluster (--peers) without certificates; a single node \
                 needs no flag to run without them"
            } else {
                "--insecure and --certs-dir contradict each other: give one"
            },
        ));
    }
    Ok(certs)
}

/// Every shard's log, recovered into its table (`tables`, in shard
/// order) for a durable single node; none in memory mode, and none yet
/// for a cluster node (`cluster` given: [`open_cluster`] opens its logs),
/// which must have a data path.
fn recover_logs(
    cfg: &Config,
    cluster: Option<&crate::cluster::ClusterConfig>,
    tables: &mut [Table],
    metrics: &Metrics,
) -> io::Result<Vec<Option<(LogFiles, Log)>>> {
    let mut logs: Vec<Option<(LogFiles, Log)>> = (0..tables.len()).map(|_| None).collect();
    if cluster.is_some() && cfg.data_path.is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a cluster node (--peers) needs --data-path: its votes and log must survive a restart",
        ));
    }
    if let (Some(path), None) = (&cfg.data_path, cluster) {
        let opening = wal::startup::Opening {
            path,
            truncate_at: cfg.wal_truncate_at,
            preallocate_bytes: cfg.wal_preallocate_bytes,
            compact_floor_bytes: cfg.compact_floor_bytes,
        };
        let (opened, us) = wal::startup::open_shard_logs(&opening, tables, now())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        metrics.set_recovery_us(us);
        for (slot, opened) in logs.iter_mut().zip(opened) {
            *slot = Some(opened);
        }
    }
    Ok(logs)
}

/// Binds every shard's lock and admin listeners (port 0 picks a port
/// once; every other shard joins it) and gathers what each shard starts
/// with, its table and log included (advertised addresses and Raft parts
/// still to come); with the bound lock and admin addresses.
fn bind_shards(
    cfg: &Config,
    tables: Vec<Table>,
    logs: Vec<Option<(LogFiles, Log)>>,
) -> io::Result<(Vec<ShardStart>, SocketAddr, SocketAddr)> {
    let multi = tables.len() > 1;
    let mut parts = Vec::with_capacity(tables.len());
    let mut lock_addr = cfg.bind;
    let mut admin_addr = cfg.admin_bind;
    for (i, (table, log)) in tables.into_iter().zip(logs).enumerate() {
        let lock = listen(lock_addr, "lock", cfg.bind_retry_ms, multi, i == 0)?;
        let admin = listen(admin_addr, "admin", cfg.bind_retry_ms, multi, i == 0)?;
        if i == 0 {
            // Port 0 picks a port once; every other shard joins it.
            lock_addr = lock.local_addr()?;
            admin_addr = admin.local_addr()?;
        }
        let faults = Faults::parse(cfg.faults.as_deref().unwrap_or("")).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("RINGLOCK_FAULTS: {e}"))
        })?;
        parts.push(ShardStart {
            lock,
            admin,
            table,
            log,
            faults,
            raft: None,
            advertised: (String::new(), String::new()),
        });
    }
    Ok((parts, lock_addr, admin_addr))
}

/// What clients are told of `bound`: the bound address, or for a cluster
/// node bound to a wildcard address its --peers host (the address the
/// other nodes give clients as the leader's).
fn advertise(cluster: Option<&crate::cluster::ClusterConfig>, bound: SocketAddr) -> SocketAddr {
    match cluster {
        Some(c) if bound.ip().is_unspecified() => {
            SocketAddr::new(c.peers[&c.node_id].ip(), bound.port())
        }
        _ => bound,
    }
}

/// Cluster mode: opens every shard's cluster log
/// ([`crate::cluster::files::open`]), builds its replica and binds its
/// Raft listener.
fn open_cluster(
    cfg: &Config,
    c: &crate::cluster::ClusterConfig,
    parts: &mut [ShardStart],
    lock_addr: SocketAddr,
    view: &Arc<crate::shard::raft::NodeView>,
) -> io::Result<()> {
    use crate::shard::raft::GroupReplica;
    let bad = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    let path = cfg.data_path.as_ref().expect("checked");
    let n = parts.len();
    let me = c.node_id;
    let logs = crate::cluster::files::open(
        path,
        n,
        me,
        |g| GroupReplica::identity(c, g, n),
        cfg.wal_preallocate_bytes,
    )
    .map_err(bad)?;
    // Given as the leader's in `not leader` hints.
    let advertise = lock_addr;
    let keep_ms = cfg.max_keepalive_ms as u64 + c.election_us() / 1000;
    for ((g, part), log) in parts.iter_mut().enumerate().zip(logs) {
        let shown = log.path.display().to_string();
        let seed = now().mono_us ^ (me << 40) ^ g as u64;
        let replica = GroupReplica::from_replayed(
            c,
            g,
            n,
            log.replayed,
            &shown,
            view.clone(),
            advertise.to_string(),
            keep_ms,
            seed,
        )
        .map_err(bad)?;
        let raft_addr = c
            .link_addr(me, g)
            .ok_or_else(|| bad("--peers port + shard overflows".into()))?;
        let listener = listen(raft_addr, "raft", cfg.bind_retry_ms, false, true)?;
        let peers = replica.link_peers();
        let hello = replica.hello(n).expect("a cluster shard has a Hello");
        log!(
            Level::Info,
            "raft_listen",
            "shard={} node={} addr={}",
            g,
            me,
            raft_addr
        );
        part.raft = Some(RaftStart {
            part: replica,
            files: log.files,
            listener,
            peers,
            hello,
        });
    }
    Ok(())
}
