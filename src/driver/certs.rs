//! The node's certificates (`--certs-dir`), shared by every shard (one
//! [`Certs`] per server, in `mesh::Shared`) and replaced whole on SIGHUP.
//!
//! A reload reads and validates the whole directory first
//! ([`crate::tls::NodeTls::load`]); a file that does not parse, a key that
//! does not match, or a certificate of another node keeps the old set and
//! says why. New connections (accepts, dials) take the set current when
//! they start; live connections keep the one they started with (rustls
//! holds its configuration in an `Arc`).
//!
//! The node's certificate is `node.crt`/`node.key`, or, where one
//! directory is shared by every node (a Kubernetes Secret mounted in each
//! pod of a StatefulSet), `node.N.crt`/`node.N.key` for node id N when
//! there is no `node.crt`.
//!
//! Each loop keeps a [`CertsView`]: one relaxed-enough atomic load per
//! accept or dial while nothing changed, the mutex only after a reload.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::tls::NodeTls;

pub struct Certs {
    dir: PathBuf,
    node: Option<u64>,
    current: Mutex<Arc<NodeTls>>,
    /// Bumped (Release) after `current` is replaced.
    generation: AtomicU64,
}

impl Certs {
    /// Loads `dir`; `node`: the node id the certificate must name (a
    /// cluster node), `None` for a single node (any node certificate).
    pub fn load(dir: PathBuf, node: Option<u64>) -> Result<Arc<Certs>, String> {
        let tls = load_dir(&dir, node)?;
        Ok(Arc::new(Certs {
            dir,
            node,
            current: Mutex::new(Arc::new(tls)),
            generation: AtomicU64::new(1),
        }))
    }

    /// Re-reads the directory; on any error the old set stays.
    pub fn reload(&self) -> Result<(), String> {
        let tls = load_dir(&self.dir, self.node)?;
        *self
            .current
            .lock()
            .expect("never poisoned: no panic under it") = Arc::new(tls);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// When the node certificate in use expires (Unix seconds).
    pub fn not_after_unix_s(&self) -> u64 {
        self.get()
            .1
            .not_after()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    fn get(&self) -> (u64, Arc<NodeTls>) {
        // Generation read first: a reload between the two reads is seen
        // again at the next check (its bump is later than our read).
        let g = self.generation.load(Ordering::Acquire);
        let t = self
            .current
            .lock()
            .expect("never poisoned: no panic under it")
            .clone();
        (g, t)
    }

    pub fn view(self: &Arc<Self>) -> CertsView {
        let (generation, now) = self.get();
        CertsView {
            shared: self.clone(),
            generation,
            now,
        }
    }
}

/// `node.crt`, or `node.N.crt` when only that is there (see the module).
fn load_dir(dir: &std::path::Path, node: Option<u64>) -> Result<NodeTls, String> {
    if let Some(n) = node {
        let (crt, key) = (
            dir.join(format!("node.{n}.crt")),
            dir.join(format!("node.{n}.key")),
        );
        if !dir.join("node.crt").exists() && crt.exists() {
            let rd =
                |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
            return NodeTls::from_pem(&rd(&dir.join("ca.crt"))?, &rd(&crt)?, &rd(&key)?, node)
                .map_err(|e| format!("{} (node.{n}.crt, node.{n}.key): {e}", dir.display()));
        }
    }
    NodeTls::load(dir, node)
}

/// One loop's copy of the current set.
pub struct CertsView {
    shared: Arc<Certs>,
    generation: u64,
    now: Arc<NodeTls>,
}

impl CertsView {
    /// The set new connections use now.
    pub fn current(&mut self) -> &NodeTls {
        if self.shared.generation.load(Ordering::Acquire) != self.generation {
            let (g, t) = self.shared.get();
            self.generation = g;
            self.now = t;
        }
        &self.now
    }

    pub fn shared(&self) -> &Arc<Certs> {
        &self.shared
    }
}
