//! The table's requests: Lock and TryLock in every access mode, Unlock,
//! the resets, a hung-up waiter's withdrawal and an undelivered grant's
//! release. Each decides in place and reports what happened as effects.

use super::*;

impl Table {
    /// Lock (blocking) or TryLock. `source` must already be resolved (an
    /// empty wire source is replaced by the peer IP by the caller). Returns
    /// the waiter slot when the request was queued; the caller needs it to
    /// withdraw the waiter if the connection hangs up.
    #[allow(clippy::too_many_arguments)] // mirrors the wire request plus time and output
    pub fn lock(
        &mut self,
        conn: Token,
        key: &(impl AsRef<[u8]> + ?Sized),
        source: &(impl AsRef<[u8]> + ?Sized),
        endpoint: SocketAddr,
        mode: LockMode,
        now: Now,
        fx: &mut Effects,
    ) -> Option<u32> {
        self.lock_with(
            conn,
            key,
            source,
            endpoint,
            mode,
            LockOpts::default(),
            now,
            fx,
        )
    }

    /// [`Table::lock`] with a hold mode, a session and a wait deadline.
    #[allow(clippy::too_many_arguments)] // mirrors the wire request plus time and output
    pub fn lock_with(
        &mut self,
        conn: Token,
        key: &(impl AsRef<[u8]> + ?Sized),
        source: &(impl AsRef<[u8]> + ?Sized),
        endpoint: SocketAddr,
        mode: LockMode,
        opts: LockOpts,
        now: Now,
        fx: &mut Effects,
    ) -> Option<u32> {
        self.lock_access(
            conn,
            key,
            source,
            endpoint,
            mode,
            opts,
            Access::Exclusive,
            now,
            fx,
        )
    }

    /// [`Table::lock_with`] for any [`Access`]: granted at once when the
    /// key is free, or when nobody waits for it and the request is
    /// compatible with its holders; else answered [`Reply::Busy`]
    /// ([`LockMode::Try`]) or queued at the back. A semaphore request of
    /// another `n` than the key's is answered [`Reply::ModeMismatch`] and
    /// changes nothing.
    #[allow(clippy::too_many_arguments)] // mirrors the wire request plus time and output
    pub fn lock_access(
        &mut self,
        conn: Token,
        key: &(impl AsRef<[u8]> + ?Sized),
        source: &(impl AsRef<[u8]> + ?Sized),
        endpoint: SocketAddr,
        mode: LockMode,
        opts: LockOpts,
        access: Access,
        now: Now,
        fx: &mut Effects,
    ) -> Option<u32> {
        let (key, source) = (key.as_ref(), source.as_ref());
        debug_assert!(!key.is_empty(), "empty keys are rejected by the codec");
        debug_assert!(key.len() <= KEY_MAX && source.len() <= SOURCE_MAX);
        assert!(access.is_valid(), "a semaphore of no slot");
        let endpoint = Endpoint::from(endpoint);
        let Ok((k, new)) = self.key_get_or_insert(key) else {
            refuse(conn, Limit::Keys, fx);
            return None;
        };
        if !new {
            debug_assert!(self.is_held(k), "a free key never stays in the table");
            if let Access::Semaphore(n) = access {
                let slots = self.slots(k);
                if slots != 0 && slots != n {
                    fx.push(Effect::Reply {
                        conn,
                        reply: Reply::ModeMismatch,
                    });
                    return None;
                }
            }
            if self.keys[k as usize].queue.is_empty() && self.compatible(k, Class::of(access)) {
                self.grant_beside_holders(k, conn, source, endpoint, opts, access, now, fx);
                return None;
            }
            if mode == LockMode::Try {
                fx.push(Effect::Reply {
                    conn,
                    reply: Reply::Busy,
                });
                return None;
            }
            return self.queue_waiter(k, conn, source, endpoint, opts, access, now, fx);
        }
        let Some(s) = self.source_get_or_insert(source) else {
            self.key_drop_if_unused(k);
            refuse(conn, Limit::Sources, fx);
            return None;
        };
        let spec = self.new_spec(opts.mode, opts.ttl_ms, opts.owner, access, now);
        self.hold(k, s, endpoint, conn, spec);
        fx.push(Effect::Granted {
            conn,
            key_slot: k,
            grant_id: spec.grant_id,
            waited_us: None,
        });
        None
    }

    /// A request compatible with the holders of held key `k`, nobody
    /// waiting: granted beside them (or refused for a limit).
    #[allow(clippy::too_many_arguments)] // lock_access's request, less the key
    fn grant_beside_holders(
        &mut self,
        k: u32,
        conn: Token,
        source: &[u8],
        endpoint: Endpoint,
        opts: LockOpts,
        access: Access,
        now: Now,
        fx: &mut Effects,
    ) {
        // Beside the holders: a share takes a waiter of the
        // budget, the free inline slot none.
        let budgeted = self.keys[k as usize].holder.is_some();
        if budgeted && !self.budget.take_waiter() {
            refuse(conn, Limit::Waiters, fx);
            return;
        }
        let Some(s) = self.source_get_or_insert(source) else {
            if budgeted {
                self.budget.free_waiters(1);
            }
            refuse(conn, Limit::Sources, fx);
            return;
        };
        let spec = self.new_spec(opts.mode, opts.ttl_ms, opts.owner, access, now);
        self.place(k, s, endpoint, conn, spec, budgeted);
        fx.push(Effect::Granted {
            conn,
            key_slot: k,
            grant_id: spec.grant_id,
            waited_us: None,
        });
    }

    /// A request that must wait for held key `k`: queued at the back of its
    /// queue and on its source's and owner's lists (or refused for a
    /// limit); the waiter's slot.
    #[allow(clippy::too_many_arguments)] // lock_access's request, less the key
    fn queue_waiter(
        &mut self,
        k: u32,
        conn: Token,
        source: &[u8],
        endpoint: Endpoint,
        opts: LockOpts,
        access: Access,
        now: Now,
        fx: &mut Effects,
    ) -> Option<u32> {
        // Server-wide: every shard's waiters count against one
        // `--max-waiters`.
        if !self.budget.take_waiter() {
            refuse(conn, Limit::Waiters, fx);
            return None;
        }
        let Some(s) = self.source_get_or_insert(source) else {
            self.budget.free_waiters(1);
            refuse(conn, Limit::Sources, fx);
            return None;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        let w = self.waiters.insert(Waiter {
            key: k,
            conn,
            source: s,
            endpoint,
            enqueued_mono_us: now.mono_us,
            mode: opts.mode,
            ttl_ms: opts.ttl_ms,
            owner: opts.owner,
            class: Class::of(access),
            seq,
            links: new_links(),
        }) as u32;
        if let Access::Semaphore(n) = access {
            let m = self.multi_make(k);
            m.slots = n;
            m.sem_users += 1;
        }
        if opts.owner != NIL {
            let (owners, waiters) = (&mut self.owners, &mut self.waiters);
            owners[opts.owner as usize]
                .waiting
                .push_back(waiters, w, W_OWN);
        }
        if let Some(d) = opts.deadline_us {
            self.waits.push(Reverse((d, w, seq)));
        }
        {
            let (keys, waiters) = (&mut self.keys, &mut self.waiters);
            keys[k as usize].queue.push_back(waiters, w, W_KEY);
        }
        {
            let (sources, waiters) = (&mut self.sources, &mut self.waiters);
            sources[s as usize].waiting.push_back(waiters, w, W_SRC);
        }
        Some(w)
    }

    /// Releases every holder of `key`, if held, and grants it to the next
    /// waiters. Answers the requester (`conn`, if any) `+` whether or not
    /// the key was held.
    fn release_key(
        &mut self,
        conn: Option<Token>,
        key: &[u8],
        cause: ReleaseCause,
        now: Now,
        fx: &mut Effects,
    ) {
        if let Some(k) = self.find_key(key) {
            let e = &self.keys[k as usize];
            if e.multi == NIL {
                // Free, or held by one exclusive holder.
                if e.holder.is_some() {
                    self.clear_at(k, At::Inline, now, cause, fx);
                    self.grant_ready(k, now, fx);
                }
            } else if self.is_held(k) {
                self.clear_all(k, now, cause, fx);
                self.grant_ready(k, now, fx);
            }
        }
        if let Some(conn) = conn {
            fx.push(Effect::Reply {
                conn,
                reply: Reply::Ok,
            });
        }
    }

    /// Unlock: releases the key whoever asks (Locking-Center has no owner
    /// check) and hands it to the next waiter. A free key answers `+`.
    ///
    /// A key held shared or as a semaphore loses **every** holder, as on
    /// [`Table::reset_by_key`]: an ownerless Unlock cannot tell which
    /// holder it would be (a Locking-Center client never holds such a
    /// key: its Lock is exclusive), and freeing one arbitrary holder
    /// would be a silent, partial surprise. Unlock means "free this key",
    /// as it does for an exclusive session or lease holder today; each
    /// holder released this way is told like any forced release
    /// ([`ReleaseCause::Unlock`] is [`forced`](ReleaseCause::forced)),
    /// and the next grant's higher token fences them all.
    pub fn unlock(
        &mut self,
        conn: Token,
        key: &(impl AsRef<[u8]> + ?Sized),
        now: Now,
        fx: &mut Effects,
    ) {
        self.release_key(Some(conn), key.as_ref(), ReleaseCause::Unlock, now, fx);
    }

    /// ResetByKey: releases every holder; waiters keep their places.
    pub fn reset_by_key(
        &mut self,
        conn: Option<Token>,
        key: &(impl AsRef<[u8]> + ?Sized),
        now: Now,
        fx: &mut Effects,
    ) {
        self.release_key(conn, key.as_ref(), ReleaseCause::ResetByKey, now, fx);
    }

    /// Compare-and-reset: releases the holder of `key` whose grant is
    /// `token` (the holder an operator saw; the other holders of a shared
    /// or semaphore key stay). True if it did.
    pub fn reset_if(
        &mut self,
        key: &(impl AsRef<[u8]> + ?Sized),
        token: u64,
        now: Now,
        fx: &mut Effects,
    ) -> bool {
        // One probe of the index: the slot found is the one released.
        let Some(k) = self.find_key(key.as_ref()) else {
            return false;
        };
        let Some(at) = self.find_grant(k, token) else {
            return false;
        };
        self.clear_at(k, at, now, ReleaseCause::ResetByKey, fx);
        self.grant_ready(k, now, fx);
        true
    }

    /// ResetBySource: answers `-` to every queued Lock of `source`, then
    /// releases every hold it has (granting each key to its next waiters).
    /// Waiters are answered first so that none of them can be granted a key
    /// its own source is giving up in the same call.
    pub fn reset_by_source(
        &mut self,
        conn: Option<Token>,
        source: &(impl AsRef<[u8]> + ?Sized),
        now: Now,
        fx: &mut Effects,
    ) {
        let source = source.as_ref();
        if let Some(s) = self.find_source(source) {
            while let Some(w) = self.sources[s as usize].waiting.front() {
                let waiter = self.detach_waiter(w);
                // The key is held (it had a queue), so it stays in the table.
                fx.push(Effect::Reply {
                    conn: waiter.conn,
                    reply: Reply::Withdrawn,
                });
            }
            // The source entry goes with its last hold (nothing here makes
            // a new one, so its slot stays vacant).
            while let Some(e) = self.sources.get(s as usize) {
                let (k, at) = if let Some(k) = e.held.front() {
                    (k, At::Inline)
                } else if let Some(x) = e.shares.front() {
                    (self.shares[x as usize].key, At::Share(x))
                } else {
                    break;
                };
                self.clear_at(k, at, now, ReleaseCause::ResetBySource, fx);
                self.grant_ready(k, now, fx);
            }
            if self.sources.contains(s as usize) && self.find_source(source) == Some(s) {
                self.source_drop_if_unused(s);
            }
            self.grant_unblocked(now, fx);
        }
        if let Some(conn) = conn {
            fx.push(Effect::Reply {
                conn,
                reply: Reply::Ok,
            });
        }
    }

    /// A queued waiter's connection hung up: withdraw it. It is never
    /// granted and nothing is answered. `w` must be a live waiter slot.
    /// Of a shared or semaphore key's queue, the waiters behind it may be
    /// grantable now: [`Table::grant_unblocked`].
    pub fn withdraw(&mut self, w: u32) {
        let waiter = self.detach_waiter(w);
        self.source_drop_if_unused(waiter.source);
        // The key is held (it had a queue); it stays.
        debug_assert!(self.is_held(waiter.key));
    }

    /// Gives back a grant whose `+` could not be delivered. Does nothing if
    /// that grant no longer holds the key (already unlocked or reset).
    pub fn release_grant(
        &mut self,
        key_slot: u32,
        grant_id: u64,
        now: Now,
        fx: &mut Effects,
    ) -> bool {
        let Some(at) = self.grant_in(key_slot, grant_id) else {
            return false;
        };
        self.clear_at(key_slot, at, now, ReleaseCause::Undelivered, fx);
        self.grant_ready(key_slot, now, fx);
        true
    }
}
