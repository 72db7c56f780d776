//! `fsync-probe`: how fast can this disk make a small write durable?
//!
//! Durable lock servers pay one durable write per group commit, so the
//! fastest durable write of the disk is the floor of any durable
//! acknowledgement. Two modes:
//!
//! - `fsync-probe DIR [COUNT]` (the original mode, used by `scripts/bench.sh`
//!   and `scripts/durable-bench.sh`): `write(4 KiB)` appended + `fdatasync`,
//!   COUNT times; prints one line of `key=value` pairs (microseconds).
//! - `fsync-probe --compare [--count N] [--sizes 64,4096] [--rounds R]
//!   [--strategies a,b] [--kv] DIR`: every write strategy a log could use,
//!   side by side in the same run, for each record size. The samples are
//!   interleaved: R rounds, each taking N/R samples of every (strategy,
//!   size) case in a rotating order, so a noisy neighbour on a shared
//!   machine hits every case alike. Prints a table (or, with `--kv`, one
//!   `key=value` line per case).
//!
//! The strategies (each on its own file in DIR, records written one after
//! the other at increasing offsets, like a log):
//!
//! | name | file | one durable write |
//! |---|---|---|
//! | `append+fdatasync` | grows (today's log) | `pwrite` at the end, `fdatasync` |
//! | `fallocated+fdatasync` | `fallocate`d, never written | `pwrite` in place, `fdatasync` |
//! | `zeroed+fdatasync` | `fallocate`d, zero-filled, fsynced once | `pwrite` in place, `fdatasync` |
//! | `zeroed+rwf_dsync` | the same | `pwritev2(RWF_DSYNC)` (one syscall) |
//! | `zeroed+o_dsync` | the same, opened `O_DSYNC` | `pwrite` |
//! | `zeroed+o_direct` | the same, opened `O_DIRECT\|O_DSYNC` | `pwrite` of the 4 KiB-aligned blocks holding the record, from an aligned buffer |
//! | `uring:…` | as above | the same through io_uring: a linked write → fdatasync pair (what ringlockd submits), or one `Write` with `RWF_DSYNC` in `rw_flags`, or one `Write` on the `O_DIRECT\|O_DSYNC` file |
//!
//! Why `fallocated` and `zeroed` differ: on ext4 (and XFS) `fallocate`
//! leaves *unwritten* extents; the first write into one converts it, which
//! is a metadata change the journal must commit, just like an append's
//! new size. Only space that has been written once (zeros) and synced can
//! be overwritten with no metadata to commit.
//!
//! Every case reads its last record back at the end and compares it with
//! what it wrote (exit 1 on a mismatch), so a strategy that silently wrote
//! nothing cannot look fast.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use io_uring::{opcode, squeue, types, IoUring};

/// The O_DIRECT block: the logical block size of every disk we run on
/// (4 KiB also satisfies 512-byte devices).
const BLOCK_BYTES: usize = 4096;

/// Samples per case taken before measuring (first-touch of the page cache
/// and of the ring's worker threads).
const WARMUP_SAMPLES: usize = 10;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--compare") {
        match CompareArgs::parse(&args[1..]) {
            Ok(a) => compare(&a),
            Err(e) => {
                eprintln!("error: {e}\n{USAGE}");
                std::process::exit(64);
            }
        }
    } else if args.first().is_some_and(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
    } else {
        classic(&args);
    }
}

const USAGE: &str = "usage: fsync-probe DIR [COUNT]
       fsync-probe --compare [--count N] [--sizes 64,4096] [--rounds R] [--strategies a,b] [--kv] DIR
strategies: append+fdatasync fallocated+fdatasync zeroed+fdatasync zeroed+rwf_dsync zeroed+o_dsync
            zeroed+o_direct and the same with a uring: prefix (uring:append+fdatasync, ...)";

fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("error: {what}: {e}");
    std::process::exit(1)
}

/// The original mode: 4 KiB appended + fdatasync, one `key=value` line.
fn classic(args: &[String]) {
    let dir = args.first().cloned().unwrap_or_else(|| ".".into());
    let count: usize = args.get(1).and_then(|c| c.parse().ok()).unwrap_or(200);
    let path = Path::new(&dir).join("fsync-probe.dat");
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| die(&format!("open {}", path.display()), e));
    let block = vec![0xA5u8; 4096];
    let mut samples_us = Vec::with_capacity(count);
    for i in 0..count + WARMUP_SAMPLES {
        let t = Instant::now();
        // Append, like a WAL: the file grows, so metadata changes too.
        if let Err(e) = file.write_all_at(&block, (i * block.len()) as u64) {
            die("write", e);
        }
        if let Err(e) = file.sync_data() {
            die("fdatasync", e);
        }
        if i >= WARMUP_SAMPLES {
            samples_us.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    let _ = std::fs::remove_file(&path);
    let s = Summary::of(samples_us);
    let _ = writeln!(
        io::stdout(),
        "fdatasync_4k count={count} mean_us={:.1} p50_us={:.1} p90_us={:.1} p99_us={:.1} max_us={:.1}",
        s.mean_us, s.p50_us, s.p90_us, s.p99_us, s.max_us
    );
}

struct Summary {
    count: usize,
    mean_us: f64,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    max_us: f64,
}

impl Summary {
    fn of(mut samples_us: Vec<f64>) -> Summary {
        assert!(!samples_us.is_empty(), "at least one sample");
        samples_us.sort_by(|a, b| a.total_cmp(b));
        let pct = |p: f64| samples_us[((samples_us.len() as f64 - 1.0) * p).round() as usize];
        Summary {
            count: samples_us.len(),
            mean_us: samples_us.iter().sum::<f64>() / samples_us.len() as f64,
            p50_us: pct(0.5),
            p90_us: pct(0.9),
            p99_us: pct(0.99),
            max_us: pct(1.0),
        }
    }
}

// ----- compare mode ----------------------------------------------------------

#[derive(Clone, Copy, PartialEq)]
enum Prep {
    /// Empty file that grows with every record.
    Append,
    /// `fallocate`d space (unwritten extents), synced once.
    Fallocated,
    /// `fallocate`d, zero-filled and synced once: overwrites change no metadata.
    Zeroed,
}

#[derive(Clone, Copy, PartialEq)]
enum Durable {
    /// A write, then fdatasync (two syscalls, or a linked pair on the ring).
    Fdatasync,
    /// One write carrying `RWF_DSYNC`.
    RwfDsync,
    /// One write on a file opened `O_DSYNC`.
    ODsync,
    /// One write of whole aligned blocks on a file opened `O_DIRECT|O_DSYNC`.
    ODirect,
}

#[derive(Clone, Copy)]
struct Strategy {
    name: &'static str,
    prep: Prep,
    durable: Durable,
    uring: bool,
}

const fn s(name: &'static str, prep: Prep, durable: Durable, uring: bool) -> Strategy {
    Strategy {
        name,
        prep,
        durable,
        uring,
    }
}

const STRATEGIES: &[Strategy] = &[
    s("append+fdatasync", Prep::Append, Durable::Fdatasync, false),
    s(
        "fallocated+fdatasync",
        Prep::Fallocated,
        Durable::Fdatasync,
        false,
    ),
    s("zeroed+fdatasync", Prep::Zeroed, Durable::Fdatasync, false),
    s("zeroed+rwf_dsync", Prep::Zeroed, Durable::RwfDsync, false),
    s("zeroed+o_dsync", Prep::Zeroed, Durable::ODsync, false),
    s("zeroed+o_direct", Prep::Zeroed, Durable::ODirect, false),
    s(
        "uring:append+fdatasync",
        Prep::Append,
        Durable::Fdatasync,
        true,
    ),
    s(
        "uring:fallocated+fdatasync",
        Prep::Fallocated,
        Durable::Fdatasync,
        true,
    ),
    s(
        "uring:zeroed+fdatasync",
        Prep::Zeroed,
        Durable::Fdatasync,
        true,
    ),
    s(
        "uring:zeroed+rwf_dsync",
        Prep::Zeroed,
        Durable::RwfDsync,
        true,
    ),
    s(
        "uring:zeroed+o_direct",
        Prep::Zeroed,
        Durable::ODirect,
        true,
    ),
];

struct CompareArgs {
    dir: PathBuf,
    count: usize,
    sizes: Vec<usize>,
    rounds: usize,
    strategies: Vec<Strategy>,
    kv: bool,
}

impl CompareArgs {
    fn parse(args: &[String]) -> Result<CompareArgs, String> {
        let mut a = CompareArgs {
            dir: PathBuf::new(),
            count: 500,
            sizes: vec![64, 4096],
            rounds: 10,
            strategies: STRATEGIES.to_vec(),
            kv: false,
        };
        let mut dir = None;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match arg.as_str() {
                "--count" => a.count = positive("--count", &value("--count")?)?,
                "--rounds" => a.rounds = positive("--rounds", &value("--rounds")?)?,
                "--sizes" => {
                    a.sizes = value("--sizes")?
                        .split(',')
                        .map(|v| positive("--sizes", v))
                        .collect::<Result<_, _>>()?;
                }
                "--strategies" => {
                    a.strategies = value("--strategies")?
                        .split(',')
                        .map(|n| {
                            STRATEGIES
                                .iter()
                                .find(|s| s.name == n)
                                .copied()
                                .ok_or_else(|| format!("unknown strategy {n:?}"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                "--kv" => a.kv = true,
                other if other.starts_with('-') => return Err(format!("unknown option {other}")),
                other if dir.is_none() => dir = Some(PathBuf::from(other)),
                other => return Err(format!("unexpected argument {other}")),
            }
        }
        a.dir = dir.ok_or("DIR is required")?;
        if a.rounds > a.count {
            return Err(format!(
                "--rounds {} is more than --count {}",
                a.rounds, a.count
            ));
        }
        Ok(a)
    }
}

fn positive(name: &str, v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{name}: {v:?} is not a positive number")),
    }
}

/// A buffer whose start is aligned to `BLOCK_BYTES`, as O_DIRECT requires,
/// without unsafe code: a Vec with one block of slack, used from the first
/// aligned byte. The Vec never grows, so the address stays put.
struct Aligned {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let storage = vec![0u8; len + BLOCK_BYTES];
        let start = storage.as_ptr().align_offset(BLOCK_BYTES);
        assert!(start < BLOCK_BYTES, "a u8 buffer can always be aligned");
        Aligned {
            storage,
            start,
            len,
        }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
    fn as_ref(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }
}

/// One (strategy, record size) pair: its file, its position and samples.
struct Case {
    strategy: Strategy,
    size: usize,
    path: PathBuf,
    file: File,
    /// The next record's number; record n lives at `n * size`.
    next: usize,
    /// The bytes of the blocks the O_DIRECT strategies rewrite (a copy of
    /// the file's tail block(s) with the new record laid over it).
    direct: Aligned,
    /// The file offset of `direct`'s first byte (block-aligned).
    direct_first: usize,
    record: Vec<u8>,
    samples_us: Vec<f64>,
}

impl Case {
    fn open(dir: &Path, strategy: Strategy, size: usize, records: usize) -> io::Result<Case> {
        let path = dir.join(format!(
            "fsync-probe.{}.{size}.dat",
            strategy.name.replace([':', '+'], "-")
        ));
        let capacity = (records * size).div_ceil(BLOCK_BYTES) * BLOCK_BYTES + BLOCK_BYTES;
        // Prepare with ordinary buffered writes, then reopen with the flags
        // the strategy measures.
        {
            let f = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(&path)?;
            if strategy.prep != Prep::Append {
                // SAFETY: plain syscall on an fd we own (`f` lives past it);
                // mode 0 allocates and extends the size. A stale fd would
                // allocate in another file; bench/tests/fsync_probe.rs runs
                // every strategy and reads the records back.
                let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, capacity as libc::off_t) };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if strategy.prep == Prep::Zeroed {
                let zeros = vec![0u8; 1 << 20];
                let mut at = 0;
                while at < capacity {
                    let n = zeros.len().min(capacity - at);
                    f.write_all_at(&zeros[..n], at as u64)?;
                    at += n;
                }
            }
            f.sync_all()?;
            if let Some(d) = path.parent() {
                File::open(d)?.sync_all()?;
            }
        }
        let mut o = OpenOptions::new();
        o.read(true).write(true);
        match strategy.durable {
            Durable::ODsync => {
                o.custom_flags(libc::O_DSYNC);
            }
            Durable::ODirect => {
                o.custom_flags(libc::O_DIRECT | libc::O_DSYNC);
            }
            Durable::Fdatasync | Durable::RwfDsync => {}
        }
        let file = o.open(&path)?;
        Ok(Case {
            strategy,
            size,
            path,
            file,
            next: 0,
            direct: Aligned::new(size.div_ceil(BLOCK_BYTES) * BLOCK_BYTES + BLOCK_BYTES),
            direct_first: 0,
            record: vec![0u8; size],
            samples_us: Vec::new(),
        })
    }

    /// Writes the next record durably; returns the time it took (µs).
    fn one(&mut self, ring: &mut IoUring) -> io::Result<f64> {
        let n = self.next;
        self.next += 1;
        // A pattern that differs per record, so the read-back check means
        // something.
        for (i, b) in self.record.iter_mut().enumerate() {
            *b = (n as u8).wrapping_mul(31).wrapping_add(i as u8) | 1;
        }
        let offset = n * self.size;
        let t = Instant::now();
        match self.strategy.durable {
            Durable::ODirect => {
                // Rewrite the aligned block(s) holding the record. The
                // buffer mirrors the file from `direct_first` on: the bytes
                // before the record are earlier records, kept from the last
                // write; when the record starts in a later block, the
                // buffer slides forward (what was past the old tail block
                // moves down, the rest is the file's zeros).
                let first = offset / BLOCK_BYTES * BLOCK_BYTES;
                let end = (offset + self.size).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
                let buf = self.direct.as_mut();
                if first != self.direct_first {
                    let shift = first - self.direct_first;
                    let keep = buf.len().saturating_sub(shift);
                    buf.copy_within(shift.min(buf.len()).., 0);
                    buf[keep..].fill(0);
                    self.direct_first = first;
                }
                buf[offset - first..offset - first + self.size].copy_from_slice(&self.record);
                let len = end - first;
                self.write(ring, Which::Direct(len), first)?;
            }
            _ => self.write(ring, Which::Record, offset)?,
        }
        Ok(t.elapsed().as_secs_f64() * 1e6)
    }

    fn write(&mut self, ring: &mut IoUring, which: Which, offset: usize) -> io::Result<()> {
        let buf: &[u8] = match which {
            Which::Record => &self.record,
            Which::Direct(len) => &self.direct.as_ref()[..len],
        };
        let fd = self.file.as_raw_fd();
        if self.strategy.uring {
            let rw_flags = if self.strategy.durable == Durable::RwfDsync {
                libc::RWF_DSYNC
            } else {
                0
            };
            let write = opcode::Write::new(types::Fd(fd), buf.as_ptr(), buf.len() as u32)
                .offset(offset as u64)
                .rw_flags(rw_flags)
                .build()
                .user_data(1);
            let sync = self.strategy.durable == Durable::Fdatasync;
            // SAFETY: `buf` borrows self, which outlives this call, and the
            // call waits for every CQE before returning, so the kernel is
            // done with the buffer when it ends; returning earlier would
            // let the next sample overwrite a buffer still being written.
            // bench/tests/fsync_probe.rs reads every record back.
            unsafe {
                let mut sq = ring.submission();
                if sync {
                    sq.push(&write.flags(squeue::Flags::IO_LINK))
                        .map_err(|_| io::Error::other("submission queue full"))?;
                    let fsync = opcode::Fsync::new(types::Fd(fd))
                        .flags(types::FsyncFlags::DATASYNC)
                        .build()
                        .user_data(2);
                    sq.push(&fsync)
                        .map_err(|_| io::Error::other("submission queue full"))?;
                } else {
                    sq.push(&write)
                        .map_err(|_| io::Error::other("submission queue full"))?;
                }
            }
            let want = if sync { 2 } else { 1 };
            ring.submit_and_wait(want)?;
            let mut got = 0;
            let mut error = None;
            while got < want {
                let Some(cqe) = ring.completion().next() else {
                    ring.submit_and_wait(want - got)?;
                    continue;
                };
                got += 1;
                let res = cqe.result();
                if res < 0 {
                    error.get_or_insert(io::Error::from_raw_os_error(-res));
                } else if cqe.user_data() == 1 && res as usize != buf.len() {
                    // A short write broke the link: the fdatasync was
                    // cancelled, so nothing is durable. A probe reports it.
                    error.get_or_insert(io::Error::other(format!(
                        "short write: {res} of {} bytes",
                        buf.len()
                    )));
                }
            }
            return error.map_or(Ok(()), Err);
        }
        match self.strategy.durable {
            Durable::Fdatasync => {
                self.file.write_all_at(buf, offset as u64)?;
                self.file.sync_data()
            }
            Durable::RwfDsync => {
                let iov = libc::iovec {
                    iov_base: buf.as_ptr() as *mut libc::c_void,
                    iov_len: buf.len(),
                };
                // SAFETY: one iovec over `buf`, which lives through the
                // (synchronous) call; a wrong length would write past it.
                // bench/tests/fsync_probe.rs reads the records back.
                let n =
                    unsafe { libc::pwritev2(fd, &iov, 1, offset as libc::off_t, libc::RWF_DSYNC) };
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                if n as usize != buf.len() {
                    return Err(io::Error::other(format!(
                        "short write: {n} of {} bytes",
                        buf.len()
                    )));
                }
                Ok(())
            }
            Durable::ODsync | Durable::ODirect => self.file.write_all_at(buf, offset as u64),
        }
    }

    /// Reads the last record back (through a plain descriptor, so O_DIRECT
    /// alignment does not apply) and compares it with what was written.
    fn verify(&self) -> io::Result<()> {
        let last = self.next.checked_sub(1).expect("a case wrote records");
        let mut got = vec![0u8; self.size];
        File::open(&self.path)?.read_exact_at(&mut got, (last * self.size) as u64)?;
        if got != self.record {
            return Err(io::Error::other(format!(
                "{} size {}: record {last} reads back different bytes",
                self.strategy.name, self.size
            )));
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Which {
    Record,
    Direct(usize),
}

fn compare(a: &CompareArgs) {
    let mut ring = IoUring::new(8).unwrap_or_else(|e| die("io_uring_setup", e));
    let mut cases = Vec::new();
    let mut unsupported = Vec::new();
    for &strategy in &a.strategies {
        for &size in &a.sizes {
            match Case::open(&a.dir, strategy, size, a.count + WARMUP_SAMPLES) {
                Ok(c) => cases.push(c),
                // O_DIRECT on a file system without it (tmpfs) or fallocate
                // where unsupported: say so in the table, measure the rest.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    unsupported.push((strategy.name, size, e.to_string()));
                }
                Err(e) => die(&format!("prepare {} size {size}", strategy.name), e),
            }
        }
    }
    for c in &mut cases {
        for _ in 0..WARMUP_SAMPLES {
            if let Err(e) = c.one(&mut ring) {
                die(&format!("{} size {}", c.strategy.name, c.size), e);
            }
        }
    }
    let per_round = a.count / a.rounds;
    for round in 0..a.rounds {
        // The last round takes the remainder, so every case gets `count`.
        let take = if round + 1 == a.rounds {
            a.count - per_round * (a.rounds - 1)
        } else {
            per_round
        };
        // Rotate the order so no case always follows the same neighbour.
        let n = cases.len();
        for k in 0..n {
            let c = &mut cases[(k + round) % n];
            for _ in 0..take {
                match c.one(&mut ring) {
                    Ok(us) => c.samples_us.push(us),
                    Err(e) => die(&format!("{} size {}", c.strategy.name, c.size), e),
                }
            }
        }
    }
    let mut out = io::stdout().lock();
    if !a.kv {
        let _ = writeln!(
            out,
            "{:<28} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "strategy", "bytes", "count", "mean_us", "p50_us", "p90_us", "p99_us", "max_us"
        );
    }
    for c in cases {
        if let Err(e) = c.verify() {
            die("read back", e);
        }
        let _ = std::fs::remove_file(&c.path);
        let s = Summary::of(c.samples_us);
        if a.kv {
            let _ = writeln!(
                out,
                "probe strategy={} size={} count={} mean_us={:.1} p50_us={:.1} p90_us={:.1} p99_us={:.1} max_us={:.1}",
                c.strategy.name, c.size, s.count, s.mean_us, s.p50_us, s.p90_us, s.p99_us, s.max_us
            );
        } else {
            let _ = writeln!(
                out,
                "{:<28} {:>6} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                c.strategy.name, c.size, s.count, s.mean_us, s.p50_us, s.p90_us, s.p99_us, s.max_us
            );
        }
    }
    for (name, size, why) in unsupported {
        if a.kv {
            let _ = writeln!(
                out,
                "probe strategy={name} size={size} unsupported=\"{why}\""
            );
        } else {
            let _ = writeln!(out, "{name:<28} {size:>6} unsupported here: {why}");
        }
    }
}
