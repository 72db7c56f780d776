//! Which shard owns a key: the one routing function every layer that
//! splits keys over shards (the event loops, the log's per-shard files,
//! recovery) agrees on.

/// The shard that owns `key` among `n` (CRC32C of the key bytes, mod n).
/// Fixed and documented: a restart with a different `n` redistributes the
/// held keys by the same function.
pub fn owner(key: &[u8], n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    (crc32c::crc32c(key) as usize) % n
}
