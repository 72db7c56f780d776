//! Test-only fault injection for the log's write chains (`RINGLOCK_FAULTS`,
//! see docs/wal.md): makes the n-th write short or fail with ENOSPC, the
//! n-th fdatasync fail with EIO, the n-th compaction write fail, the n-th
//! preallocation growth step fail, or delays every append's fdatasync or
//! every growth step's zero write. Counting starts at 1.
//!
//! Only built with the `faults` cargo feature (the test suite turns it on);
//! without it every hook is an identity the compiler removes, and a
//! non-empty `RINGLOCK_FAULTS` is refused at start-up. The deterministic
//! simulator covers far more faults than these; they remain for the
//! end-to-end tests that need the real kernel and disk.

#[cfg(feature = "faults")]
mod imp {
    #[derive(Debug, Default)]
    pub struct Faults {
        short_write_every: u64,
        fail_write_at: Vec<u64>,
        fail_fsync_at: Vec<u64>,
        fail_compact_write_at: Vec<u64>,
        fail_grow_at: Vec<u64>,
        /// Every append's fdatasync starts this long after its write (a
        /// linked timeout in the chain): widens the window in which answers
        /// wait for the log, so tests can act inside it deterministically.
        pub fsync_delay: Option<Box<io_uring::types::Timespec>>,
        /// Every growth step of the preallocation waits this long between
        /// its fallocate and its zero write, so appends catch up with the
        /// range it is about to zero (they must wait for it).
        pub grow_delay: Option<Box<io_uring::types::Timespec>>,
        compact_writes: u64,
        writes: u64,
        fsyncs: u64,
        grows: u64,
    }

    impl Faults {
        /// Parses `short_write_every=N,fail_write_at=N,fail_fsync_at=N,
        /// fail_compact_write_at=N,fail_grow_at=N,fsync_delay_ms=N,
        /// grow_delay_ms=N` (the fail_* may repeat).
        pub fn parse(spec: &str) -> Result<Faults, String> {
            let mut f = Faults::default();
            for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let (k, v) = part
                    .split_once('=')
                    .ok_or_else(|| format!("fault {part:?}: expected name=number"))?;
                let n: u64 = v
                    .parse()
                    .map_err(|_| format!("fault {part:?}: not a number"))?;
                match k {
                    "short_write_every" => f.short_write_every = n,
                    "fail_write_at" => f.fail_write_at.push(n),
                    "fail_fsync_at" => f.fail_fsync_at.push(n),
                    "fail_compact_write_at" => f.fail_compact_write_at.push(n),
                    "fail_grow_at" => f.fail_grow_at.push(n),
                    "fsync_delay_ms" => f.fsync_delay = Some(Box::new(timespec_ms(n))),
                    "grow_delay_ms" => f.grow_delay = Some(Box::new(timespec_ms(n))),
                    _ => return Err(format!("unknown fault {k:?}")),
                }
            }
            Ok(f)
        }

        /// Per submitted write: how many of `len` bytes to submit, the
        /// write's number, and whether it will be failed. A shortened or
        /// failing write is submitted alone, as the kernel ends a chain
        /// after a real short or failed write.
        pub fn plan_write(&mut self, len: usize, compaction: bool) -> (usize, u64, bool) {
            self.writes += 1;
            let mut fail = self.fail_write_at.contains(&self.writes);
            if compaction {
                self.compact_writes += 1;
                fail |= self.fail_compact_write_at.contains(&self.compact_writes);
            }
            if self.short_write_every > 0
                && self.writes.is_multiple_of(self.short_write_every)
                && len > 1
            {
                return (len / 2, self.writes, fail);
            }
            (len, self.writes, fail)
        }

        /// Per fdatasync completion (the counter advances here).
        pub fn fsync_result(&mut self, res: i32) -> i32 {
            self.fsyncs += 1;
            if self.fail_fsync_at.contains(&self.fsyncs) && res >= 0 {
                return -libc::EIO;
            }
            res
        }

        /// Per growth step: whether its zero write is to be reported as
        /// failed (ENOSPC; the zeros it wrote are harmless).
        pub fn plan_grow(&mut self) -> bool {
            self.grows += 1;
            self.fail_grow_at.contains(&self.grows)
        }

        pub fn fsync_delay(&self) -> Option<*const io_uring::types::Timespec> {
            self.fsync_delay.as_deref().map(|t| t as *const _)
        }

        pub fn grow_delay(&self) -> Option<*const io_uring::types::Timespec> {
            self.grow_delay.as_deref().map(|t| t as *const _)
        }
    }

    fn timespec_ms(n: u64) -> io_uring::types::Timespec {
        io_uring::types::Timespec::new()
            .sec(n / 1000)
            .nsec(((n % 1000) * 1_000_000) as u32)
    }
}

#[cfg(not(feature = "faults"))]
mod imp {
    #[derive(Debug, Default)]
    pub struct Faults;

    impl Faults {
        pub fn parse(spec: &str) -> Result<Faults, String> {
            if spec.trim().is_empty() {
                return Ok(Faults);
            }
            Err(
                "this ringlockd was built without the `faults` feature (test-only fault injection)"
                    .into(),
            )
        }
        #[inline(always)]
        pub fn plan_write(&mut self, len: usize, _compaction: bool) -> (usize, u64, bool) {
            (len, 0, false)
        }
        #[inline(always)]
        pub fn fsync_result(&mut self, res: i32) -> i32 {
            res
        }
        #[inline(always)]
        pub fn plan_grow(&mut self) -> bool {
            false
        }
        #[inline(always)]
        pub fn fsync_delay(&self) -> Option<*const io_uring::types::Timespec> {
            None
        }
        #[inline(always)]
        pub fn grow_delay(&self) -> Option<*const io_uring::types::Timespec> {
            None
        }
    }
}

pub use imp::Faults;
