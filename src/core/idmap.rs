//! Maps keyed by ids the server assigns itself (session ids, owner ids,
//! connection tokens, node ids): a fast fixed hash instead of SipHash with
//! a per-process random key.
//!
//! Why fixed is safe here: these keys are never chosen by a client (a
//! session id is handed out by the server; a Resume naming an unknown one
//! is looked up, never inserted), so there is no hash flooding to defend
//! against. Why fixed is wanted: the map's iteration order then depends
//! only on what was inserted, so the same events give the same order in
//! every process — the deterministic simulators replay a seed exactly
//! (with a random key, releases and snapshots walked these maps in a
//! different order each run). Keys that clients choose (lock names) never
//! go into an [`IdMap`].

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// An empty [`IdMap`].
pub fn id_map<K, V>() -> IdMap<K, V> {
    HashMap::with_hasher(BuildHasherDefault::default())
}

/// Integers: the splitmix64 finalizer (every input bit reaches every
/// output bit, so sequential ids spread over the buckets). Other input
/// (byte strings) is folded 8 bytes at a time through the same mixer.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w) ^ chunk.len() as u64);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = mix(self.0.rotate_left(5) ^ n ^ 0x9e37_79b9_7f4a_7c15);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(n as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_inserts_give_the_same_order() {
        let fill = || {
            let mut m: IdMap<u64, u64> = id_map();
            for i in 0..1000u64 {
                m.insert(i.wrapping_mul(0x1234_5678_9abc_def1) | (1 << 55), i);
            }
            m.into_keys().collect::<Vec<_>>()
        };
        assert_eq!(fill(), fill());
    }

    #[test]
    fn sequential_ids_spread_over_the_buckets() {
        // The low bits of the hash pick the bucket: 4096 sequential ids
        // must use most of 256 low-byte values.
        let mut seen = [false; 256];
        for i in 0..4096u64 {
            let mut h = IdHasher::default();
            h.write_u64(i);
            seen[(h.finish() & 0xff) as usize] = true;
        }
        assert!(seen.iter().filter(|&&s| s).count() > 250);
    }
}
