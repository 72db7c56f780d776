//! rustls driven from the loop's own buffers: the kernel has no kTLS, and
//! the event loop owns every socket, so TLS is a pure transformation here
//! — ciphertext a receive brought in, plaintext out; plaintext to send in,
//! ciphertext for the next send out. No thread, no blocking call: rustls
//! never touches a socket (it reads from and writes to byte slices).
//!
//! Buffers: a receive's bytes are copied into rustls' own deframer before
//! the receive buffer is lent again; the ciphertext to send is written
//! into the caller's (not lent) buffer, which is then lent to one send.

use std::io::{Read, Write};

use rustls::Connection;

/// Feeds `data` (ciphertext from the socket) to `tls` and appends the
/// plaintext it yields to `plain`. `Ok(true)`: the peer closed the TLS
/// session (close_notify). An error is fatal for the connection (rustls
/// has a TLS alert for the peer, which [`output`] still yields).
pub fn input(tls: &mut Connection, mut data: &[u8], plain: &mut Vec<u8>) -> Result<bool, String> {
    let mut closed = false;
    while !data.is_empty() {
        // read_tls takes at most what its deframer has room for; the
        // packets are processed before the next call, so it makes room.
        let n = tls
            .read_tls(&mut data)
            .map_err(|e| format!("TLS input: {e}"))?;
        let st = tls.process_new_packets().map_err(|e| format!("TLS: {e}"))?;
        let have = st.plaintext_bytes_to_read();
        if have > 0 {
            let at = plain.len();
            plain.resize(at + have, 0);
            tls.reader()
                .read_exact(&mut plain[at..])
                .map_err(|e| format!("TLS plaintext: {e}"))?;
        }
        closed |= st.peer_has_closed();
        if n == 0 {
            break;
        }
    }
    Ok(closed)
}

/// Hands `plain` to `tls` for encryption (after the handshake; before it,
/// a client connection would buffer it, which callers avoid).
pub fn encrypt(tls: &mut Connection, plain: &[u8]) -> Result<(), String> {
    tls.writer()
        .write_all(plain)
        .map_err(|e| format!("TLS output: {e}"))
}

/// Appends every TLS record `tls` has to send (handshake flights, alerts,
/// encrypted data) to `out`.
pub fn output(tls: &mut Connection, out: &mut Vec<u8>) -> Result<(), String> {
    while tls.wants_write() {
        tls.write_tls(out).map_err(|e| format!("TLS output: {e}"))?;
    }
    Ok(())
}
