//! Leader election: a candidate campaigns, leads, proclaims a new value and
//! resigns; an observer prints every leader (docs/client.md, "Leader
//! election").
//!
//! ```text
//! ringlockd &
//! cargo run --example election -- observe db-primary          # prints the leader at every change
//! cargo run --example election -- campaign db-primary db-1:5432 # in other shells: candidates
//! ```
//!
//! `RINGLOCK_ADDR=HOST:PORT` for another server.

use std::time::Duration;

use ringlock::client::Session;

fn main() -> Result<(), ringlock::lease::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = std::env::var("RINGLOCK_ADDR").unwrap_or_else(|_| "127.0.0.1:22119".into());
    let session = Session::connect(addr.as_str())?;
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["campaign", name, value] => {
            let election = session.election(name)?;
            let mut leading = election.campaign(value, None)?;
            println!("leading with token {}", leading.token());
            std::thread::sleep(Duration::from_secs(5));
            leading.proclaim(format!("{value} (proclaimed)"))?;
            println!("proclaimed a new value");
            std::thread::sleep(Duration::from_secs(5));
            leading.resign()?;
            println!("resigned");
            Ok(())
        }
        ["observe", name] => {
            let mut observer = session.election(name)?.observe()?;
            let show = |o: &ringlock::client::Observer| match o.leader() {
                Some(l) => println!("leader {} {}", l.token, String::from_utf8_lossy(&l.value)),
                None => println!("nobody leads"),
            };
            show(&observer);
            // A minute of quiet ends the example.
            while observer.changed(Some(Duration::from_secs(60)))? {
                show(&observer);
            }
            observer.close()
        }
        _ => {
            eprintln!("usage: election campaign NAME VALUE | election observe NAME");
            std::process::exit(2);
        }
    }
}
