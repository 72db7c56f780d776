//! The cluster's shape per seed, and what happened between the shards
//! of a node, over every seed of the test.
//!
//! Shards per node (`World::groups`): `SIM_GROUPS=N` for every seed, else
//! a regression seed's own (`REGRESSION_SEEDS`: the shards it failed
//! with), else by seed: 1 for seeds ≡ 0, 1 (mod 4), 2 for ≡ 2, 3 for ≡ 3, so the
//! default 37 seeds (and the regression seeds) run 3 and 5 nodes × 1, 2 and 3 shards (the node count
//! is drawn from the seed's generator as before; a seed of one shard
//! draws from it as it did before shards). The run fails unless the seeds
//! of more than
//! one shard handed connections over, sent messages between shards and
//! moved the leadership of a group other than group 0 at least once,
//! and every shape ran.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::World;

/// Shards per node for `seed`: `SIM_GROUPS`, else a regression seed's
/// (the shards it failed with), else by seed.
pub fn groups_of(seed: u64) -> usize {
    if let Ok(v) = std::env::var("SIM_GROUPS") {
        let g: usize = v.parse().expect("SIM_GROUPS");
        assert!((1..=8).contains(&g), "SIM_GROUPS: 1 to 8");
        return g;
    }
    if let Some(r) = super::regression(seed) {
        return r.groups;
    }
    [1, 1, 2, 3][(seed % 4) as usize]
}

static MULTI_RUNS: AtomicU64 = AtomicU64::new(0);
static MIGRATIONS: AtomicU64 = AtomicU64::new(0);
static MESH: AtomicU64 = AtomicU64::new(0);
static RESUME_MOVES: AtomicU64 = AtomicU64::new(0);
/// Leader changes of groups other than 0 (each group elects alone and
/// follows group 0's leader).
static GROUP_FAILOVERS: AtomicU64 = AtomicU64::new(0);
/// Bit `(nodes == 5) * 8 + groups`: the shapes that ran.
static SHAPES: AtomicU64 = AtomicU64::new(0);

/// A run ended: what its shards did.
pub fn note(w: &World) {
    SHAPES.fetch_or(1 << ((w.n == 5) as u64 * 8 + w.groups as u64), Relaxed);
    if w.groups == 1 {
        return;
    }
    MULTI_RUNS.fetch_add(1, Relaxed);
    MIGRATIONS.fetch_add(w.migrations, Relaxed);
    MESH.fetch_add(w.mesh_messages, Relaxed);
    RESUME_MOVES.fetch_add(w.resume_moves, Relaxed);
    GROUP_FAILOVERS.fetch_add(w.group_failovers[1..].iter().sum(), Relaxed);
}

fn shapes() -> Vec<String> {
    let bits = SHAPES.load(Relaxed);
    (0..16)
        .filter(|b| bits & (1 << b) != 0)
        .map(|b| format!("{}x{}", if b >= 8 { 5 } else { 3 }, b % 8))
        .collect()
}

pub fn summary() -> String {
    format!(
        "shards: shapes (nodes x shards) {:?}; {} runs of several shards per node: {} connections \
         handed over, {} messages between shards, {} Resumes sent to their home shard, {} leader \
         changes of groups other than 0",
        shapes(),
        MULTI_RUNS.load(Relaxed),
        MIGRATIONS.load(Relaxed),
        MESH.load(Relaxed),
        RESUME_MOVES.load(Relaxed),
        GROUP_FAILOVERS.load(Relaxed)
    )
}

/// Over every seed of a default run: several shards did happen.
pub fn assert_exercised() {
    if MULTI_RUNS.load(Relaxed) == 0 {
        assert!(
            std::env::var("SIM_GROUPS").is_ok_and(|g| g == "1"),
            "no seed ran more than one shard per node"
        );
        return;
    }
    assert!(MIGRATIONS.load(Relaxed) > 0, "connections were handed over");
    assert!(MESH.load(Relaxed) > 0, "shards sent each other messages");
    assert!(
        RESUME_MOVES.load(Relaxed) > 0,
        "Resumes went to their home shard"
    );
    assert!(
        GROUP_FAILOVERS.load(Relaxed) > 0,
        "groups other than 0 changed leaders"
    );
    if std::env::var("SIM_GROUPS").is_err() && std::env::var("SIM_SEEDS").is_err() {
        assert_eq!(
            shapes(),
            ["3x1", "3x2", "3x3", "5x1", "5x2", "5x3"],
            "every shape ran"
        );
    }
}
