//! `fsync-probe DIR [COUNT]`: how long does `write(4 KiB) + fdatasync` take on
//! the disk that holds DIR? Durable lock servers pay this per group commit,
//! so it is the floor of any durable acknowledgement. Prints one line of
//! `key=value` pairs (microseconds).

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = args.next().unwrap_or_else(|| ".".into());
    let count: usize = args.next().and_then(|c| c.parse().ok()).unwrap_or(200);
    let path = std::path::Path::new(&dir).join("fsync-probe.dat");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| {
            eprintln!("error: open {}: {e}", path.display());
            std::process::exit(1)
        });
    let block = vec![0xA5u8; 4096];
    let mut samples_us = Vec::with_capacity(count);
    for i in 0..count + 10 {
        let t = Instant::now();
        // Append, like a WAL: the file grows, so metadata changes too.
        if let Err(e) = file.write_all_at(&block, (i * block.len()) as u64) {
            eprintln!("error: write: {e}");
            std::process::exit(1);
        }
        if let Err(e) = file.sync_data() {
            eprintln!("error: fdatasync: {e}");
            std::process::exit(1);
        }
        if i >= 10 {
            samples_us.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let _ = std::fs::remove_file(&path);
    samples_us.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| samples_us[((samples_us.len() as f64 - 1.0) * p).round() as usize];
    let mean = samples_us.iter().sum::<f64>() / samples_us.len() as f64;
    let mut out = std::io::stdout();
    let _ = writeln!(
        out,
        "fdatasync_4k count={count} mean_us={mean:.1} p50_us={:.1} p90_us={:.1} p99_us={:.1} max_us={:.1}",
        pct(0.5),
        pct(0.9),
        pct(0.99),
        pct(1.0)
    );
}
