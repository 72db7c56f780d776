//! Watching a key: who holds it now, then every change of its holders as
//! the server pushes it (docs/client.md, "Watching a key").
//!
//! ```text
//! ringlockd &
//! cargo run --example watch -- deploy            # RINGLOCK_ADDR=HOST:PORT for another server
//! ringlock lock deploy -- sleep 1                # in another shell: a grant, then a release
//! ```

use std::time::Duration;

use ringlock::client::{EventKind, Session};

fn main() -> Result<(), ringlock::lease::Error> {
    let key = std::env::args().nth(1).unwrap_or_else(|| "deploy".into());
    let addr = std::env::var("RINGLOCK_ADDR").unwrap_or_else(|_| "127.0.0.1:22119".into());
    let session = Session::connect(addr.as_str())?;
    let mut watch = session.watch(&key)?;
    for h in watch.holders() {
        println!(
            "held by {:?} (token {})",
            String::from_utf8_lossy(&h.source),
            h.token
        );
    }
    // Each change, in the order the server decided them; a minute of
    // quiet ends the example.
    while let Some(e) = watch.next(Some(Duration::from_secs(60)))? {
        match e.kind {
            EventKind::Granted => println!("granted to token {}", e.holder.token),
            EventKind::Proclaimed => println!(
                "token {} now under {:?}",
                e.holder.token,
                String::from_utf8_lossy(&e.holder.source)
            ),
            kind => println!("token {} gone: {}", e.holder.token, kind.name()),
        }
    }
    watch.close()
}
