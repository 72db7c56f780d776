//! Buffers and who may touch them.
//!
//! A buffer handed to the kernel for an op is wrapped in [`Lent`], which
//! has no accessor at all: the only way back to the bytes is
//! [`Lent::reclaim`], called with the op's final completion. A buffer that
//! belongs to the kernel therefore cannot be read, written, grown or
//! dropped by mistake — the receive-buffer bug (a buffer drained while a
//! recv was writing into it) is unrepresentable. Dropping a `Lent` while
//! its op may still run would free memory under the kernel: `Drop` aborts
//! instead (a leak would be safe, a use-after-free is not).

/// A heap buffer whose memory the kernel may be reading or writing.
pub struct Lent {
    buf: Option<Vec<u8>>,
    /// The `user_data` of the op it was lent to.
    op: u64,
}

impl Lent {
    /// Lends `buf` for the op `user_data`; returns the buffer's address
    /// for the SQE (stable: a Vec's heap memory does not move while the
    /// Vec itself is not touched).
    pub fn lend(buf: Vec<u8>, user_data: u64) -> Lent {
        Lent {
            buf: Some(buf),
            op: user_data,
        }
    }

    pub fn ptr(&self) -> *const u8 {
        self.buf.as_ref().expect("a lent buffer").as_ptr()
    }

    pub fn mut_ptr(&mut self) -> *mut u8 {
        self.buf.as_mut().expect("a lent buffer").as_mut_ptr()
    }

    pub fn capacity(&self) -> usize {
        self.buf.as_ref().expect("a lent buffer").capacity()
    }

    pub fn len(&self) -> usize {
        self.buf.as_ref().expect("a lent buffer").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gives up the buffer for good (the server is stopping with the op
    /// possibly still in flight): leaked, never freed under the kernel.
    pub fn leak(mut self) {
        std::mem::forget(self.buf.take());
    }

    /// The op's final completion arrived: the buffer is ours again.
    pub fn reclaim(mut self, user_data: u64) -> Vec<u8> {
        assert_eq!(
            user_data, self.op,
            "a buffer reclaimed by a completion of another op"
        );
        self.buf.take().expect("a lent buffer")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if self.buf.is_some() && !std::thread::panicking() {
            // Freeing it could let the kernel write into reused memory.
            eprintln!("fatal: a buffer lent to the kernel was dropped before its op completed");
            std::process::abort();
        }
    }
}

/// A buffer slot: ours, or the kernel's for one op.
pub enum Slot {
    Ours(Vec<u8>),
    Kernel(Lent),
    /// Transiently empty while moving between the two.
    Moving,
}

impl Slot {
    pub fn is_lent(&self) -> bool {
        matches!(self, Slot::Kernel(_))
    }

    /// Takes our buffer out (panics if the kernel has it).
    pub fn take_ours(&mut self) -> Vec<u8> {
        match std::mem::replace(self, Slot::Moving) {
            Slot::Ours(v) => v,
            Slot::Kernel(_) => panic!("taking a buffer the kernel owns"),
            Slot::Moving => panic!("taking a buffer that is moving"),
        }
    }

    pub fn ours(&mut self) -> &mut Vec<u8> {
        match self {
            Slot::Ours(v) => v,
            _ => panic!("touching a buffer the kernel owns"),
        }
    }

    /// Reclaims the lent buffer at the op's final completion.
    pub fn reclaim(&mut self, user_data: u64) -> &mut Vec<u8> {
        match std::mem::replace(self, Slot::Moving) {
            Slot::Kernel(l) => *self = Slot::Ours(l.reclaim(user_data)),
            _ => panic!("a completion for a buffer that was not lent"),
        }
        self.ours()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_buffer_comes_back_only_to_its_op() {
        let l = Lent::lend(vec![1, 2, 3], 7);
        assert_eq!(l.len(), 3);
        assert_eq!(l.reclaim(7), vec![1, 2, 3]);
        let mut s = Slot::Kernel(Lent::lend(vec![9], 5));
        assert!(s.is_lent());
        assert_eq!(s.reclaim(5), &vec![9]);
        assert!(!s.is_lent());
    }

    #[test]
    #[should_panic(expected = "another op")]
    fn reclaim_by_another_op_panics() {
        let l = Lent::lend(vec![1], 7);
        let _ = l.reclaim(8);
    }

    #[test]
    #[should_panic(expected = "kernel owns")]
    fn touching_a_lent_slot_panics() {
        let mut s = Slot::Kernel(Lent::lend(vec![1], 7));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.ours().push(1);
        }));
        // Give the buffer back so the abort-on-drop guard stays quiet.
        let _ = s.reclaim(7);
        std::panic::resume_unwind(r.expect_err("touching a lent slot must panic"));
    }
}
