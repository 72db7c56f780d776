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

/// `tls` without rustls' own 64 KiB cap on unsent records: its callers
/// bound what they hand over themselves (a link's queue), and hand over
/// only when their send slot is free, so the records of one hand-over are
/// all taken by the next [`output`]. With the cap, [`encrypt`] of a Raft
/// batch over 64 KiB would fail half-way.
pub fn unlimited(mut tls: Connection) -> Connection {
    tls.set_buffer_limit(None);
    tls
}

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

#[cfg(all(test, feature = "cli"))]
mod tests {
    use super::*;
    use crate::tls::gen;
    use crate::tls::testkit::new_ca;

    /// A Raft batch larger than rustls' default buffer limit goes through
    /// one encrypt/output/input round whole (it failed half-way with the
    /// default limit).
    #[test]
    fn a_megabyte_crosses_in_one_hand_over() {
        let ca = new_ca();
        let (a, b) = (ca.node(1), ca.node(2));
        let mut client =
            rustls::ClientConnection::new(a.peer_dialer(2), crate::tls::peer_server_name(2))
                .expect("client");
        let mut server = rustls::ServerConnection::new(b.peer_acceptor()).expect("server");
        gen::handshake(&mut client, &mut server).expect("handshake");
        let (mut c, mut s) = (unlimited(client.into()), unlimited(server.into()));
        let plain: Vec<u8> = (0..(1u32 << 20)).map(|i| i as u8).collect();
        encrypt(&mut c, &plain).expect("encrypt a megabyte");
        let mut wire = Vec::new();
        output(&mut c, &mut wire).expect("output");
        let mut got = Vec::new();
        // In receive-sized pieces, as the loop feeds it.
        for chunk in wire.chunks(64 * 1024) {
            assert!(!input(&mut s, chunk, &mut got).expect("input"));
        }
        assert_eq!(got, plain);
    }
}
