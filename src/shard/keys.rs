//! `KEYS`/`KEYX`/`KEYH` streamed: the answer is produced a bounded chunk at a time
//! while it is being sent, never built whole.
//!
//! Every shard keeps a listing of its own held keys ([`Table::listing_begin`]:
//! 4 bytes a key, the holders as they were when it began) and answers
//! chunk requests over the remote-op mechanism: `KeysOpen` (count and first
//! chunk, after its log is durable like any answer), `KeysMore` (the next
//! chunk of the shards asked), `KeysClose` (the reader left). The
//! connection's home shard writes the total count, then merges the shards'
//! chunks by key into the connection's output, at most [`OUT_CHUNK`] bytes
//! per send; the next chunk is produced when the send completed, and a
//! shard's next chunk is asked for when its last one is used up. What a
//! `KEYS` costs beyond the table is the listings plus one chunk per shard
//! and one output chunk.
//!
//! [`Table::listing_begin`]: crate::core::Table::listing_begin

use super::*;
use crate::core::table::{entry_len, Step};
use crate::core::ListForm;

pub(super) mod stream;
use stream::{Served, ShardChunk, Stream};

/// Output bytes produced per send.
pub const OUT_CHUNK: usize = 64 << 10;

/// Bytes a shard encodes per chunk: the shards' chunks together stay near
/// 256 KiB, at least 2 KiB (a few entries) each.
fn chunk_bytes(shards: usize) -> u32 {
    ((256usize << 10) / shards.max(1)).clamp(2 << 10, 64 << 10) as u32
}

impl Shard {
    /// KEYS/KEYX/KEYH on the admin connection in `slot`.
    pub(super) fn keys_start(&mut self, slot: u32, form: ListForm) {
        let token = self.token(slot);
        self.conns[slot as usize].state = State::Gathering;
        let id = self.next_gather_id;
        self.streams.push(Stream {
            id,
            token: Some(token),
            form,
            parts: (0..self.shards)
                .map(|_| ShardChunk {
                    buf: Vec::new(),
                    pos: 0,
                    done: true,
                })
                .collect(),
            count: 0,
            opened: false,
            round: false,
            closing: false,
            failed: false,
            sending: false,
        });
        let chunk = chunk_bytes(self.shards);
        self.keys_round(
            id,
            RemoteOp::KeysOpen {
                stream: id,
                form,
                chunk,
            },
        );
    }

    /// Sends one round of stream requests to every shard.
    fn keys_round(&mut self, stream: u64, op: RemoteOp) {
        let id = self.next_gather_id;
        self.next_gather_id += 1;
        let s = self.stream_mut(stream);
        s.round = true;
        s.closing = matches!(op, RemoteOp::KeysClose { .. });
        let token = s.token.unwrap_or(0);
        self.gathers.push(Gather {
            id,
            token,
            op: op.clone(),
            pending: self.shards,
            failed: false,
            lock_port: false,
            reset: Vec::new(),
            stream,
            status: Vec::new(),
            members: Vec::new(),
            refused: Vec::new(),
        });
        self.cmds.push(Cmd::Scatter { id, op });
    }

    fn stream_mut(&mut self, stream: u64) -> &mut Stream {
        self.streams
            .iter_mut()
            .find(|s| s.id == stream)
            .expect("a stream in progress")
    }

    /// A shard's reply to a stream round.
    pub(super) fn keys_part(&mut self, stream: u64, result: RemoteResult) {
        let s = self.stream_mut(stream);
        match result {
            RemoteResult::KeysPart {
                shard,
                count,
                bytes,
                step,
            } => {
                s.count += count as u64;
                s.failed |= step == Step::Overflowed;
                s.parts[shard as usize] = ShardChunk {
                    buf: bytes,
                    pos: 0,
                    done: step != Step::More,
                };
            }
            RemoteResult::Failed => s.failed = true,
            RemoteResult::Done
            | RemoteResult::Reset(_)
            | RemoteResult::Status(_)
            | RemoteResult::Members(_)
            | RemoteResult::Refused(_) => {}
        }
    }

    /// Every shard answered the stream's round.
    pub(super) fn keys_round_done(&mut self, stream: u64) {
        let conn = self.stream_mut(stream).token;
        let slot = conn.and_then(|t| self.conn_of(t));
        let s = self.stream_mut(stream);
        s.round = false;
        if s.closing {
            if s.failed {
                // A shard could not be told (its queue was full): again,
                // or its listing would stay.
                s.failed = false;
                self.keys_round(stream, RemoteOp::KeysClose { stream });
            } else {
                self.streams.retain(|s| s.id != stream);
            }
            return;
        }
        let Some(slot) = slot else {
            self.keys_close(stream);
            return;
        };
        if s.failed {
            let opened = s.opened;
            s.token = None;
            let c = &mut self.conns[slot as usize];
            if opened {
                // Part of the answer is out: it cannot be taken back or
                // finished, so the connection ends short of it.
                log!(
                    Level::Warn,
                    "keys_aborted",
                    "peer={} reason=\"holders changed faster than the answer was read, or a shard could not be reached\"",
                    c.peer
                );
                c.out.clear();
                self.close(slot);
            } else {
                c.out.clear();
                c.out.push(b'-');
                c.state = State::Answered;
                c.gate_lsn = 0;
                self.mark_dirty(slot);
            }
            self.keys_close(stream);
            return;
        }
        if !s.opened {
            s.opened = true;
            let count = s.count as u32;
            let c = &mut self.conns[slot as usize];
            c.out.clear();
            c.out.extend_from_slice(&count.to_le_bytes());
        }
        if !self.stream_mut(stream).sending {
            self.keys_produce(stream, slot);
        }
    }

    /// The reader is gone or the stream failed: every shard drops its
    /// listing.
    fn keys_close(&mut self, stream: u64) {
        let s = self.stream_mut(stream);
        s.token = None;
        if !s.round {
            self.keys_round(stream, RemoteOp::KeysClose { stream });
        }
    }

    /// Merges the parts into the connection's output until a send's worth
    /// is there, a part needs its next chunk, or the answer is complete.
    fn keys_produce(&mut self, stream: u64, slot: u32) {
        let i = self
            .streams
            .iter()
            .position(|s| s.id == stream)
            .expect("a stream in progress");
        let (streams, conns) = (&mut self.streams, &mut self.conns);
        let s = &mut streams[i];
        let out = &mut conns[slot as usize].out;
        let form = s.form;
        let mut want: Vec<u32> = Vec::new();
        let finished = loop {
            want.extend(
                s.parts
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.pos == p.buf.len() && !p.done)
                    .map(|(i, _)| i as u32),
            );
            if !want.is_empty() {
                break false;
            }
            // The smallest key at the head of a part; each part is sorted.
            let mut min: Option<usize> = None;
            for (i, p) in s.parts.iter().enumerate() {
                if p.pos == p.buf.len() {
                    continue;
                }
                let key = entry_key(&p.buf[p.pos..]);
                if min.is_none_or(|m| key < entry_key(&s.parts[m].buf[s.parts[m].pos..])) {
                    min = Some(i);
                }
            }
            let Some(m) = min else { break true };
            if out.len() >= OUT_CHUNK {
                break false;
            }
            let p = &mut s.parts[m];
            let len = entry_len(&p.buf[p.pos..], form);
            out.extend_from_slice(&p.buf[p.pos..p.pos + len]);
            p.pos += len;
            if p.pos == p.buf.len() {
                // A used-up chunk's memory goes back before the next.
                p.buf = Vec::new();
                p.pos = 0;
            }
        };
        let has_out = !out.is_empty();
        if finished {
            self.streams.swap_remove(i);
        } else {
            s.sending = has_out;
        }
        let c = &mut self.conns[slot as usize];
        if has_out {
            c.state = State::Answered;
            c.gate_lsn = 0;
            self.mark_dirty(slot);
        } else if finished {
            c.state = State::Idle;
            self.pump(slot);
            self.settle_idle(slot);
        } else {
            c.state = State::Gathering;
        }
        if !want.is_empty() {
            self.keys_round(stream, RemoteOp::KeysMore { stream, want });
        }
    }

    /// The connection in `slot` sent a chunk of its stream: true if it has
    /// one (the next chunk is on its way), false for an ordinary answer.
    pub(super) fn keys_sent(&mut self, slot: u32) -> bool {
        if self.streams.is_empty() {
            return false;
        }
        let token = self.token(slot);
        let Some(s) = self.streams.iter_mut().find(|s| s.token == Some(token)) else {
            return false;
        };
        s.sending = false;
        let (stream, round) = (s.id, s.round);
        self.conns[slot as usize].state = State::Gathering;
        if !round {
            self.keys_produce(stream, slot);
        }
        true
    }

    /// The connection in `slot` is closing: its stream, if any, ends.
    pub(super) fn keys_gone(&mut self, slot: u32) {
        if self.streams.is_empty() {
            return;
        }
        let token = self.token(slot);
        if let Some(stream) = self
            .streams
            .iter()
            .find(|s| s.token == Some(token))
            .map(|s| s.id)
        {
            self.keys_close(stream);
        }
    }

    // ----- every shard: its listings -----------------------------------------

    /// A stream request from shard `from`: `None` for an op that is not
    /// one.
    pub(super) fn keys_remote(&mut self, from: usize, op: &RemoteOp) -> Option<RemoteResult> {
        let me = self.me as u32;
        Some(match *op {
            RemoteOp::KeysOpen {
                stream,
                form,
                chunk,
            } => {
                let (id, count) = self.table.listing_begin(self.now.unix_ms, form);
                let mut bytes = Vec::new();
                let step = self.table.listing_next(id, chunk as usize, &mut bytes);
                if step == Step::More {
                    self.served.push(Served {
                        from,
                        stream,
                        id,
                        chunk,
                    });
                }
                RemoteResult::KeysPart {
                    shard: me,
                    count,
                    bytes,
                    step,
                }
            }
            RemoteOp::KeysMore { stream, ref want } => {
                if !want.contains(&me) {
                    return Some(RemoteResult::Done);
                }
                let Some(i) = self
                    .served
                    .iter()
                    .position(|l| l.from == from && l.stream == stream)
                else {
                    return Some(RemoteResult::Failed);
                };
                let l = &self.served[i];
                let mut bytes = Vec::new();
                let step = self.table.listing_next(l.id, l.chunk as usize, &mut bytes);
                if step != Step::More {
                    self.served.swap_remove(i);
                }
                RemoteResult::KeysPart {
                    shard: me,
                    count: 0,
                    bytes,
                    step,
                }
            }
            RemoteOp::KeysClose { stream } => {
                if let Some(i) = self
                    .served
                    .iter()
                    .position(|l| l.from == from && l.stream == stream)
                {
                    let l = self.served.swap_remove(i);
                    self.table.listing_end(l.id);
                }
                RemoteResult::Done
            }
            _ => return None,
        })
    }
}

/// The key of the encoded entry at the front of `b`.
fn entry_key(b: &[u8]) -> &[u8] {
    &b[1..1 + b[0] as usize]
}
