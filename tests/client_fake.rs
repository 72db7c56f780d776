//! Client logic that the real server cannot be made to exhibit on demand:
//! a grant that arrives after the deadline, a server that comes up late, a
//! guard whose connection broke, an Unlock whose answer is lost. Each test
//! runs a scripted fake server that speaks just enough of the protocol
//! (docs/protocol.md).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringlock::client::{Client, Error, LateGrant, LockOptions, RetryPolicy};

/// Serves connections one at a time with `script(index, stream)`.
fn fake(mut script: impl FnMut(usize, TcpStream) + Send + 'static) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for (i, conn) in l.incoming().enumerate() {
            let Ok(conn) = conn else { return };
            conn.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            script(i, conn);
        }
    });
    addr
}

/// An admin port whose `KEYS` lists `key` as held by whatever endpoint the
/// channel delivers (or nothing, for `None`).
fn fake_admin(holder: mpsc::Receiver<Option<(Vec<u8>, String)>>) -> SocketAddr {
    fake(move |_, mut s| {
        let mut cmd = [0u8; 4];
        s.read_exact(&mut cmd).unwrap();
        assert_eq!(&cmd, b"KEYS");
        let entry = holder.recv_timeout(Duration::from_secs(10)).unwrap();
        let mut b = Vec::new();
        match entry {
            None => b.extend_from_slice(&0u32.to_le_bytes()),
            Some((key, endpoint)) => {
                b.extend_from_slice(&1u32.to_le_bytes());
                for f in [&key[..], b"src", endpoint.as_bytes()] {
                    b.push(f.len() as u8);
                    b.extend_from_slice(f);
                }
                b.extend_from_slice(&0i64.to_le_bytes());
            }
        }
        s.write_all(&b).unwrap();
    })
}

fn read_frame(s: &mut TcpStream, with_source: bool) -> Vec<u8> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).unwrap();
    let mut frame = head.to_vec();
    let mut key = vec![0u8; head[1] as usize];
    s.read_exact(&mut key).unwrap();
    frame.extend_from_slice(&key);
    if with_source {
        let mut len = [0u8; 1];
        s.read_exact(&mut len).unwrap();
        let mut src = vec![0u8; len[0] as usize];
        s.read_exact(&mut src).unwrap();
        frame.push(len[0]);
        frame.extend_from_slice(&src);
    }
    frame
}

fn read_to_eof(s: &mut TcpStream) -> usize {
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap_or(0)
}

fn client(addr: SocketAddr, admin: SocketAddr) -> Client {
    Client::builder(addr)
        .admin_addr(admin)
        .io_timeout(Duration::from_secs(2))
        .retry(RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
            max_elapsed: Duration::from_secs(2),
        })
        .build()
        .unwrap()
}

const UNLOCK_K: &[u8] = b"\x02\x01k";
/// An Unlock of a key no test uses: sent last, it marks the end of what a
/// fake server has to report.
const SENTINEL: &[u8] = b"\x02\x08sentinel";

fn sentinel(addr: SocketAddr) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(SENTINEL).unwrap();
    let mut answer = [0u8; 1];
    s.read_exact(&mut answer).unwrap();
}

/// `+` lands after the deadline but before the server saw the half-close:
/// the client must honour it either way the caller chose.
/// What the fake saw: (connection index, frame) per connection.
type Seen = Vec<(usize, Vec<u8>)>;

fn late_grant(policy: LateGrant) -> (Result<(), Error>, Seen) {
    let (tx, rx) = mpsc::channel();
    let addr = fake(move |i, mut s| {
        if i == 0 {
            let frame = read_frame(&mut s, true);
            assert_eq!(frame[0], 1, "Lock");
            // The half-close is the client's deadline passing; the `+` then
            // races it, as a grant sent just before the server saw the EOF.
            assert_eq!(
                read_to_eof(&mut s),
                0,
                "client half-closed, sent nothing more"
            );
            s.write_all(b"+").unwrap();
            tx.send((i, frame)).unwrap();
        } else {
            let frame = read_frame(&mut s, false);
            s.write_all(b"+").unwrap();
            tx.send((i, frame)).unwrap();
        }
    });
    let c = client(addr, addr);
    let t0 = Instant::now();
    let opts = LockOptions::new()
        .timeout(Duration::from_millis(20))
        .late_grant(policy);
    let result = match c.lock_with("k", &opts) {
        Ok(mut g) => {
            assert!(
                t0.elapsed() >= Duration::from_millis(20),
                "not before the deadline"
            );
            assert!(g.endpoint().is_some());
            let r = g.release();
            assert!(g.release().is_ok(), "cached result");
            r
        }
        Err(e) => Err(e),
    };
    let seen = rx.iter().take(2).collect();
    (result, seen)
}

#[test]
fn late_grant_is_kept_and_released_on_a_new_connection() {
    let (result, seen) = late_grant(LateGrant::Keep);
    result.expect("the guard was returned and released");
    assert_eq!(
        seen[1],
        (1, UNLOCK_K.to_vec()),
        "unlock on a fresh connection"
    );
}

#[test]
fn late_grant_is_released_when_the_caller_chose_so() {
    let (result, seen) = late_grant(LateGrant::Release);
    assert!(matches!(result, Err(Error::Timeout)), "{result:?}");
    assert_eq!(
        seen[1],
        (1, UNLOCK_K.to_vec()),
        "the late grant was released"
    );
}

#[test]
fn connection_failures_are_retried_until_the_server_comes_up() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l); // nothing listens for a while
    let server = thread::spawn(move || {
        thread::sleep(Duration::from_millis(150));
        let l = TcpListener::bind(addr).unwrap();
        // First connection: accepted, then dropped while "queued".
        let (s, _) = l.accept().unwrap();
        drop(s);
        let (mut s, _) = l.accept().unwrap();
        let frame = read_frame(&mut s, true);
        s.write_all(b"+").unwrap();
        let unlock = read_frame(&mut s, false);
        s.write_all(b"+").unwrap();
        (frame, unlock)
    });
    let closed_admin = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // The outage is the scenario (a fixed 150 ms), so the retry budget is
    // far larger than it: a slow machine delays the fake, never fails this.
    let c = Client::builder(addr)
        .admin_addr(closed_admin)
        .io_timeout(Duration::from_secs(2))
        .retry(RetryPolicy {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
            max_elapsed: Duration::from_secs(60),
        })
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut g = c.lock("k").expect("retried until granted");
    assert!(t0.elapsed() >= Duration::from_millis(150));
    g.release().expect("unlock on the granting connection");
    let (frame, unlock) = server.join().unwrap();
    assert_eq!(frame, b"\x01\x01k\x00");
    assert_eq!(unlock, UNLOCK_K);
}

#[test]
fn guard_reconnects_when_its_connection_broke() {
    let (tx, rx) = mpsc::channel();
    let addr = fake(move |i, mut s| {
        let frame = read_frame(&mut s, i == 0);
        s.write_all(b"+").unwrap();
        // Connection 0 is closed by the server right after the grant; the
        // close (and its FIN, on loopback) happens before the report.
        drop(s);
        tx.send((i, frame)).unwrap();
    });
    let c = client(addr, addr);
    let mut g = c.lock("k").unwrap();
    assert_eq!(rx.recv().unwrap().0, 0);
    g.release().expect("unlock sent on a new connection");
    assert_eq!(rx.recv().unwrap(), (1, UNLOCK_K.to_vec()));
    g.release().unwrap();
    drop(g);
    // The fake serves connections in order: had the guard sent anything
    // more, it would arrive before this sentinel.
    sentinel(addr);
    assert_eq!(
        rx.recv().unwrap(),
        (2, SENTINEL.to_vec()),
        "released exactly once"
    );
}

/// The Unlock was sent but its answer was lost: only the server's table can
/// say whether to send it again.
fn lost_unlock_answer(table_says_ours: Option<bool>) -> (Result<(), Error>, usize) {
    let (tx, rx) = mpsc::channel();
    let (admin_tx, admin_rx) = mpsc::channel();
    let admin = match table_says_ours {
        Some(_) => fake_admin(admin_rx),
        None => {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap() // closed: the admin port is unreachable
        }
    };
    let addr = fake(move |i, mut s| {
        if i == 0 {
            read_frame(&mut s, true);
            s.write_all(b"+").unwrap();
            let peer = s.peer_addr().unwrap().to_string();
            read_frame(&mut s, false); // the Unlock: swallow it and hang up
            let entry = match table_says_ours {
                Some(true) => Some((b"k".to_vec(), peer)),
                Some(false) => None,
                None => None,
            };
            let _ = admin_tx.send(entry);
        } else {
            let frame = read_frame(&mut s, false);
            s.write_all(b"+").unwrap();
            if frame == SENTINEL {
                return;
            }
        }
        tx.send(i).unwrap();
    });
    let c = client(addr, admin);
    let mut g = c.lock("k").unwrap();
    let result = g.release();
    drop(g);
    // Connections are served in order: every one the client made is counted
    // once the sentinel has been answered.
    sentinel(addr);
    (result, rx.try_iter().count())
}

#[test]
fn lost_unlock_answer_resends_only_if_the_table_says_ours() {
    let (result, connections) = lost_unlock_answer(Some(true));
    result.expect("resent after the table showed our endpoint");
    assert_eq!(connections, 2);

    let (result, connections) = lost_unlock_answer(Some(false));
    result.expect("the table shows the key is no longer ours: released");
    assert_eq!(connections, 1, "no blind second Unlock");
}

#[test]
fn lost_unlock_answer_without_admin_is_an_error_not_a_guess() {
    let (result, connections) = lost_unlock_answer(None);
    match result {
        Err(Error::Io(e)) => assert!(e.to_string().contains("may still be held"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(connections, 1, "no blind second Unlock");
}

/// A Locking-Center admin port knows `KEYS` and not `KEYX`: it reads the
/// command and closes. `keyx_stream()` and `keyx()` fail at once with an
/// `UnexpectedEof` (one connection each: not retried, as retrying cannot
/// help) and `keys_stream()` lists the keys there.
#[test]
fn keyx_on_a_server_without_it_is_unexpected_eof_at_once() {
    let (tx, rx) = mpsc::channel();
    let addr = fake(move |i, mut s| {
        let mut cmd = [0u8; 4];
        s.read_exact(&mut cmd).unwrap();
        tx.send((i, cmd)).unwrap();
        if &cmd == b"KEYS" {
            let mut b = 1u32.to_le_bytes().to_vec();
            for f in [&b"k"[..], b"src", b"10.0.0.1:5"] {
                b.push(f.len() as u8);
                b.extend_from_slice(f);
            }
            b.extend_from_slice(&0i64.to_le_bytes());
            s.write_all(&b).unwrap();
        }
    });
    let c = client(addr, addr);
    match c.keyx_stream() {
        Err(Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}"),
        other => panic!("{other:?}"),
    }
    match c.keyx() {
        Err(Error::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}"),
        other => panic!("{other:?}"),
    }
    let keys: Vec<_> = c
        .keys_stream()
        .expect("KEYS")
        .collect::<Result<_, _>>()
        .expect("read");
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].key, b"k");
    let seen: Vec<(usize, [u8; 4])> = rx.try_iter().collect();
    assert_eq!(seen, [(0, *b"KEYX"), (1, *b"KEYX"), (2, *b"KEYS")]);
}
