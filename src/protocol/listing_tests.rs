//! Tests of the table's streamed listings (`core::table::listing`)
//! against the reference encoding of the whole answer (`admin::encode_keys`
//! / `encode_keyx` / `encode_keyh` of `Table::held_list`). They live here, beside the
//! encoding they compare with: core imports nothing from protocol.

use crate::core::list::NIL;
use crate::core::table::{ListingId, Step, SAVED_BYTES_MAX};
use crate::core::*;
use crate::protocol::admin;
use std::net::SocketAddr;

fn at(us: u64) -> Now {
    Now {
        mono_us: us,
        unix_ms: 1_700_000_000_000 + us / 1000,
    }
}

const FORMS: [ListForm; 3] = [ListForm::Keys, ListForm::Keyx, ListForm::Keyh];

/// A table holding `n` keys in a scrambled order (so grant order is not
/// key order), every third a lease; waiters on every fifth key; keys
/// whose number ends in 1 shared by three readers (and a writer waiting
/// on every other), in 2 a semaphore of 2 held twice with a third
/// waiting.
fn table(n: usize) -> Table {
    let mut tb = Table::new(Limits {
        max_keys: 4 * n,
        max_waiters: 4 * n,
    });
    let mut fx = Vec::new();
    for j in 0..n {
        let i = (j * 7919) % n;
        let key = format!("key-{i:06}");
        let ep = SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], (1000 + i % 60_000) as u16));
        let opts = LockOpts {
            mode: if i.is_multiple_of(3) {
                HoldMode::Lease
            } else {
                HoldMode::Persistent
            },
            ttl_ms: 60_000,
            ..LockOpts::default()
        };
        let (access, holders) = match i % 10 {
            1 => (Access::Shared, 3),
            2 => (Access::Semaphore(2), 3),
            _ => (Access::Exclusive, 1),
        };
        for h in 0..holders {
            tb.lock_access(
                (i + 2 * n * h) as u64,
                &key,
                &format!("src-{}", (i + h) % 10),
                ep,
                LockMode::Blocking,
                opts,
                access,
                at(j as u64 * 1000 + h as u64),
                &mut fx,
            );
        }
        if i.is_multiple_of(5) || i % 20 == 11 {
            tb.lock(
                (n + i) as u64,
                &key,
                "waiter",
                ep,
                LockMode::Blocking,
                at(0),
                &mut fx,
            );
        }
    }
    tb
}

/// The reference: every holder copied, sorted by key and token (each
/// key's oldest only, but for `KEYH`), encoded at once.
fn whole(tb: &Table, form: ListForm, now_unix_ms: u64) -> Vec<u8> {
    let mut held = tb.held_list();
    held.sort_by(|a, b| (a.key.as_bytes(), a.grant_id).cmp(&(b.key.as_bytes(), b.grant_id)));
    if !form.every_holder() {
        held.dedup_by(|b, a| a.key == b.key);
    }
    let mut out = Vec::new();
    match form {
        ListForm::Keys => admin::encode_keys(&held, &mut out),
        ListForm::Keyx => admin::encode_keyx(&held, now_unix_ms, &mut out),
        ListForm::Keyh => admin::encode_keyh(&held, now_unix_ms, &mut out),
    }
    out
}

/// Listing `id` to the end in chunks of `chunk` bytes, after `count`.
fn drain(tb: &mut Table, id: ListingId, count: u32, chunk: usize) -> Vec<u8> {
    let mut out = count.to_le_bytes().to_vec();
    loop {
        match tb.listing_next(id, chunk, &mut out) {
            Step::More => continue,
            Step::Done => return out,
            Step::Overflowed => panic!("overflowed"),
        }
    }
}

#[test]
fn a_listing_equals_the_whole_answer_in_any_chunk_size() {
    for form in FORMS {
        for chunk in [1, 100, 4096, usize::MAX] {
            let mut tb = table(3000);
            let now = at(5_000_000).unix_ms;
            let want = whole(&tb, form, now);
            let (id, count) = tb.listing_begin(now, form);
            // 300 keys shared by 3, 300 semaphores held by 2.
            let holders = if form.every_holder() {
                3000 + 600 + 300
            } else {
                3000
            };
            assert_eq!(count, holders, "{form:?}");
            assert_eq!(
                drain(&mut tb, id, count, chunk),
                want,
                "{form:?} chunk={chunk}"
            );
            assert_eq!(tb.listings(), 0, "a finished listing is freed");
        }
    }
    let mut tb = Table::new(Limits {
        max_keys: 1,
        max_waiters: 1,
    });
    let (id, count) = tb.listing_begin(0, ListForm::Keyh);
    assert_eq!(drain(&mut tb, id, count, 10), 0u32.to_le_bytes());
}

/// A `KEYH` answer decoded: every holder of a shared and of a semaphore
/// key, with its access, in key then token order.
#[test]
fn keyh_lists_every_holder_with_its_access() {
    let mut tb = table(20);
    let (id, count) = tb.listing_begin(0, ListForm::Keyh);
    let bytes = drain(&mut tb, id, count, 64);
    let (list, used) = admin::decode_listing(&bytes, ListForm::Keyh)
        .unwrap()
        .unwrap();
    assert_eq!(used, bytes.len());
    let of = |k: &str| -> Vec<(Option<Access>, u64)> {
        list.iter()
            .filter(|e| e.key == k.as_bytes())
            .map(|e| (e.access, e.token))
            .collect()
    };
    let shared = of("key-000001");
    assert_eq!(shared.len(), 3);
    assert!(shared.iter().all(|&(a, _)| a == Some(Access::Shared)));
    assert!(shared.windows(2).all(|w| w[0].1 < w[1].1), "token order");
    let sem = of("key-000002");
    assert_eq!(sem.len(), 2, "the third waits");
    assert!(sem.iter().all(|&(a, _)| a == Some(Access::Semaphore(2))));
    assert_eq!(
        of("key-000003"),
        vec![(Some(Access::Exclusive), of("key-000003")[0].1)]
    );
    let keys: Vec<&[u8]> = list.iter().map(|e| e.key.as_slice()).collect();
    assert!(keys.windows(2).all(|w| w[0] <= w[1]), "key order");
}

/// Holders released, reset, regranted to a waiter, extended or newly
/// granted while a listing is read: it still answers the holders of
/// its start, as they were.
#[test]
fn changes_during_a_listing_leave_its_answer_as_at_the_start() {
    for form in FORMS {
        let mut tb = table(2000);
        let now = at(3_000_000);
        let want = whole(&tb, form, now.unix_ms);
        let (id, count) = tb.listing_begin(now.unix_ms, form);
        let mut out = count.to_le_bytes().to_vec();
        assert_eq!(tb.listing_next(id, 5000, &mut out), Step::More);
        let mut fx = Vec::new();
        let later = at(9_000_000);
        for i in 0..2000usize {
            let key = format!("key-{i:06}");
            match i % 4 {
                // Unlocked (grants the waiter where there is one).
                0 => tb.unlock(i as u64, &key, later, &mut fx),
                1 => tb.reset_by_key(None, &<Name>::new(key.as_bytes()).unwrap(), later, &mut fx),
                2 if i % 3 == 0 => {
                    let token = tb.grant_of(&key).expect("held");
                    tb.extend(NIL, &key, token, 1_000, later).expect("a lease");
                }
                // A shared key's newest reader is reset, alone (not the
                // one that stands for the key).
                3 if i % 10 == 1 => {
                    let newest = tb
                        .holders_of(key.as_bytes())
                        .last()
                        .expect("held")
                        .0
                        .grant_id;
                    assert!(tb.reset_if(&key, newest, later, &mut fx));
                }
                _ => {}
            }
            // A new key, granted after the start: not listed.
            tb.lock(
                9,
                &format!("new-{i:06}"),
                "n",
                SocketAddr::from(([1, 1, 1, 1], 1)),
                LockMode::Try,
                later,
                &mut fx,
            );
        }
        // Undo-style expiry change and a second change of one key.
        tb.unlock(0, "key-000000", later, &mut fx);
        loop {
            match tb.listing_next(id, 5000, &mut out) {
                Step::More => {}
                Step::Done => break,
                Step::Overflowed => panic!("overflowed"),
            }
        }
        assert_eq!(out, want, "{form:?}");
        tb.check_invariants();
    }
}

#[test]
fn a_listing_whose_holders_change_too_much_overflows_and_frees() {
    let n = SAVED_BYTES_MAX / 30 + 10;
    let mut tb = table(n);
    let (id, _) = tb.listing_begin(0, ListForm::Keyx);
    let mut fx = Vec::new();
    for i in 0..n {
        tb.unlock(i as u64, &format!("key-{i:06}"), at(1), &mut fx);
    }
    let mut out = Vec::new();
    assert_eq!(tb.listing_next(id, 100, &mut out), Step::Overflowed);
    assert!(out.is_empty());
    assert_eq!(tb.listings(), 0);
}

#[test]
fn an_abandoned_listing_is_freed_and_changes_cost_nothing_more() {
    let mut tb = table(100);
    let (a, _) = tb.listing_begin(0, ListForm::Keyh);
    let (b, count) = tb.listing_begin(0, ListForm::Keys);
    let want = whole(&tb, ListForm::Keys, 0);
    tb.listing_end(a);
    assert_eq!(tb.listings(), 1);
    let mut fx = Vec::new();
    tb.unlock(1, "key-000001", at(1), &mut fx);
    assert_eq!(drain(&mut tb, b, count, 64), want);
}
