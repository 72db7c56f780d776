//! Intrusive doubly-linked FIFO lists whose nodes live in a [`slab::Slab`].
//!
//! A node carries one [`Link`] per list it can belong to (a waiter is on its
//! key's queue *and* on its source's list), selected by the `which` index of
//! [`Linked`]. Links are `u32` slab indices with [`NIL`] as the sentinel, so
//! push, pop and unlink from the middle are O(1) and never allocate.
//!
//! Invariants (asserted, cheap, kept in release builds):
//! - `head == NIL` iff `tail == NIL` iff `len == 0`;
//! - a node is on at most one list per link slot (`Link::linked`);
//! - the list does not own its nodes: removing a node from the slab while it
//!   is still linked is a bug the owner must prevent (unlink first).

use slab::Slab;

/// Sentinel for "no node".
pub const NIL: u32 = u32::MAX;

/// One pair of list pointers inside a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub prev: u32,
    pub next: u32,
    pub linked: bool,
}

impl Default for Link {
    fn default() -> Self {
        Link {
            prev: NIL,
            next: NIL,
            linked: false,
        }
    }
}

/// A node type that embeds one or more [`Link`]s.
pub trait Linked {
    fn link(&self, which: usize) -> &Link;
    fn link_mut(&mut self, which: usize) -> &mut Link;
}

/// Head, tail and length of one intrusive list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl Default for List {
    fn default() -> Self {
        List::new()
    }
}

/// Node storage indexed by slot: a `Slab<T>` or a `Vec<T>`.
pub trait Store<T>: std::ops::IndexMut<usize, Output = T> {}
impl<T> Store<T> for Slab<T> {}
impl<T> Store<T> for Vec<T> {}

fn node<T: Linked, S: Store<T>>(slab: &mut S, idx: u32) -> &mut T {
    &mut slab[idx as usize]
}

impl List {
    pub const fn new() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    pub fn back(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }

    fn check(&self) {
        assert_eq!(
            self.head == NIL,
            self.tail == NIL,
            "list head/tail disagree"
        );
        assert_eq!(self.head == NIL, self.len == 0, "list length disagrees");
    }

    /// Appends `idx` at the tail. O(1).
    pub fn push_back<T: Linked, S: Store<T>>(&mut self, slab: &mut S, idx: u32, which: usize) {
        self.check();
        let old_tail = self.tail;
        {
            let l = node(slab, idx).link_mut(which);
            assert!(!l.linked, "node {idx} linked twice");
            *l = Link {
                prev: old_tail,
                next: NIL,
                linked: true,
            };
        }
        if old_tail == NIL {
            self.head = idx;
        } else {
            node(slab, old_tail).link_mut(which).next = idx;
        }
        self.tail = idx;
        self.len += 1;
    }

    /// Removes `idx` from anywhere in the list. O(1).
    pub fn unlink<T: Linked, S: Store<T>>(&mut self, slab: &mut S, idx: u32, which: usize) {
        self.check();
        let l = *node(slab, idx).link(which);
        assert!(l.linked, "unlink of node {idx} that is not linked");
        if l.prev == NIL {
            assert_eq!(self.head, idx, "node {idx} claims to be head");
            self.head = l.next;
        } else {
            node(slab, l.prev).link_mut(which).next = l.next;
        }
        if l.next == NIL {
            assert_eq!(self.tail, idx, "node {idx} claims to be tail");
            self.tail = l.prev;
        } else {
            node(slab, l.next).link_mut(which).prev = l.prev;
        }
        *node(slab, idx).link_mut(which) = Link::default();
        self.len -= 1;
        self.check();
    }

    /// Removes and returns the head. O(1).
    pub fn pop_front<T: Linked, S: Store<T>>(&mut self, slab: &mut S, which: usize) -> Option<u32> {
        let h = self.front()?;
        self.unlink(slab, h, which);
        Some(h)
    }

    /// The node before `idx` on this list, if any.
    pub fn prev_of<T: Linked, S: Store<T>>(slab: &S, idx: u32, which: usize) -> Option<u32> {
        let p = slab[idx as usize].link(which).prev;
        (p != NIL).then_some(p)
    }

    /// The node after `idx` on this list, if any.
    pub fn next_of<T: Linked, S: Store<T>>(slab: &S, idx: u32, which: usize) -> Option<u32> {
        let n = slab[idx as usize].link(which).next;
        (n != NIL).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    struct N {
        v: u32,
        links: [Link; 2],
    }
    impl Linked for N {
        fn link(&self, w: usize) -> &Link {
            &self.links[w]
        }
        fn link_mut(&mut self, w: usize) -> &mut Link {
            &mut self.links[w]
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(u32),
        Pop,
        UnlinkNth(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            any::<u32>().prop_map(Op::Push),
            Just(Op::Pop),
            any::<usize>().prop_map(Op::UnlinkNth),
        ]
    }

    fn collect(list: &List, slab: &Slab<N>, which: usize) -> Vec<u32> {
        let mut out = Vec::new();
        let mut cur = list.front();
        while let Some(i) = cur {
            out.push(slab[i as usize].v);
            cur = List::next_of(slab, i, which);
        }
        out
    }

    proptest! {
        /// The list behaves exactly like a VecDeque model under push, pop and
        /// unlink-from-the-middle, on both link slots independently.
        #[test]
        fn matches_vecdeque_model(ops in proptest::collection::vec(op(), 0..300)) {
            let mut slab: Slab<N> = Slab::new();
            let mut lists = [List::new(), List::new()];
            let mut models: [VecDeque<(u32, u32)>; 2] = [VecDeque::new(), VecDeque::new()];
            for (n, o) in ops.into_iter().enumerate() {
                let which = n % 2;
                match o {
                    Op::Push(v) => {
                        let idx = slab.insert(N { v, links: [Link::default(); 2] }) as u32;
                        lists[which].push_back(&mut slab, idx, which);
                        models[which].push_back((idx, v));
                    }
                    Op::Pop => {
                        let got = lists[which].pop_front(&mut slab, which);
                        let want = models[which].pop_front();
                        prop_assert_eq!(got, want.map(|(i, _)| i));
                        if let Some(i) = got { slab.remove(i as usize); }
                    }
                    Op::UnlinkNth(k) => {
                        if !models[which].is_empty() {
                            let k = k % models[which].len();
                            let (i, _) = models[which].remove(k).unwrap();
                            lists[which].unlink(&mut slab, i, which);
                            slab.remove(i as usize);
                        }
                    }
                }
                for w in 0..2 {
                    prop_assert_eq!(lists[w].len() as usize, models[w].len());
                    let want: Vec<u32> = models[w].iter().map(|(_, v)| *v).collect();
                    prop_assert_eq!(collect(&lists[w], &slab, w), want);
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "linked twice")]
    fn double_link_is_caught() {
        let mut slab: Slab<N> = Slab::new();
        let mut l = List::new();
        let i = slab.insert(N {
            v: 1,
            links: [Link::default(); 2],
        }) as u32;
        l.push_back(&mut slab, i, 0);
        l.push_back(&mut slab, i, 0);
    }
}
