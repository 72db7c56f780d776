//! The crypto provider of every TLS configuration.

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

/// The one crypto provider of every configuration here: ring, given
/// explicitly so that a process-wide default installed by anyone else
/// changes nothing.
pub(super) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            // rustls 0.23.48 deprecates it because ring has no post-quantum
            // key exchange (X25519MLKEM768 needs aws-lc-rs, which does not
            // build offline here); ring is the provider Cargo.toml chose,
            // and this function is its only constructor.
            #[allow(deprecated)]
            let mut ring = rustls::crypto::ring::default_provider();
            // Key exchange: X25519 first, then P-256. This rustls lists
            // P-384 first for ring, which both ends then use: its ECDH
            // costs this ring build ~0.9 ms a side against ~40 µs for
            // X25519, and a handshake storm pays it per connection. P-384
            // stays last for clients that offer nothing else.
            let rank = |g: &&'static dyn rustls::crypto::SupportedKxGroup| match g.name() {
                rustls::NamedGroup::X25519 => 0,
                rustls::NamedGroup::secp256r1 => 1,
                _ => 2,
            };
            ring.kx_groups.sort_by_key(rank);
            Arc::new(ring)
        })
        .clone()
}
