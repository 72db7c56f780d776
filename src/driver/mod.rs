//! The io_uring driver: the only place with `unsafe` I/O. It owns every
//! file descriptor and every buffer lent to the kernel, turns completions
//! into shard events and shard commands into submissions.
//!
//! # Ownership
//! - A connection's receive buffer and send buffer are [`buf::Slot`]s: while
//!   an op runs they are [`buf::Lent`] (no accessor); the bytes come back
//!   only with the op's final completion. The shard never sees them: it
//!   gets received bytes as a slice copied into its own buffer, and its
//!   answers by swapping buffers ([`Shard::take_output`]).
//! - A log chain's buffer moves from the shard to the driver with the
//!   command and back with [`Shard::on_log_landed`].
//! - A socket is closed only when no op references it; only then does the
//!   shard hear [`Shard::on_closed`] and recycle the slot.
//!
//! [`Shard::take_output`]: crate::shard::Shard::take_output
//! [`Shard::on_log_landed`]: crate::shard::Shard::on_log_landed
//! [`Shard::on_closed`]: crate::shard::Shard::on_closed
//!
//! # Tick
//! `submit_and_wait` (at most a heartbeat interval, so that an idle loop
//! still proves it is alive) → drain every CQE into a local array (no handler runs
//! inside the drain) → dispatch each as a shard event → `end_tick` (frame
//! expiry, log batch, durable answers) → execute the shard's commands.
//! `user_data` = op | generation | slot ([`user_data`]); 0 is never used.
//!
//! # Files
//! `mod.rs` declares the modules and re-exports the driver's public
//! items; no file of the driver imports through it. `Loop` is defined in
//! `event_loop.rs` from types whose files do not import it
//! (`conn_slot.rs`, `clienttls_state.rs`, `logio_state.rs`,
//! `peer/links.rs` and the leaves at the end of this list); the files
//! that handle events (`start.rs`, `ring.rs`, `conn.rs`, `clienttls.rs`,
//! `logio.rs`, `peer/`) each add an `impl Loop` block over its fields:
//! - `event_loop.rs`: the `Loop` struct, its `Drop` (buffers still lent
//!   are leaked), `dispatch` (a completion → its handler) and `execute`
//!   (a shard command → its handler).
//! - `start.rs`: [`Server`] — log recovery, listeners, signal mask, one
//!   thread per shard with CPU pinning — and `Loop::new`.
//! - `ring.rs`: ring sizing and set-up, `push`/`reserve_sq`, the wait
//!   (heartbeat-bounded, after the idle poll), the drain, the tick loop
//!   `run`, and the mesh's intake and doorbells.
//! - `conn.rs`: a connection's I/O: accept or refuse, receive, send,
//!   close, migration between shards; `conn_slot.rs`: a connection
//!   slot's driver side (`DConn`).
//! - `clienttls.rs`: TLS on the lock and admin ports, driven by the loop;
//!   `clienttls_state.rs`: its data (a connection's TLS session, the
//!   loop's handshake budget and deadlines).
//! - `logio.rs`: the log's I/O, steered by the write planner;
//!   `logio_state.rs`: its data (`LogIo`, the steps' `user_data` slots).
//! - `peer/`: cluster mode's Raft links to the other nodes (`links.rs`:
//!   the links' data and limits; `mod.rs`: a peer op's completion,
//!   dialing and outbound links; `inbound.rs`: accepted links).
//! - `tlsio.rs`: rustls over the loop's own buffers (ciphertext in and
//!   out; no thread, no socket call); `certs.rs`: the node's certificates,
//!   shared by every shard (through [`mesh::Shared`]) and replaced whole
//!   on SIGHUP.
//! - `sys.rs`: the libc calls outside the ring (bind, peer address, fd
//!   limit, signalfd, CPU affinity, clocks); [`allowed_cpus`];
//!   `port_owner.rs`: who holds a port a bind found in use.
//! - [`buf`]: the buffer lent to the kernel and its owner states.
//! - [`user_data`]: the `user_data` codec.
//! - [`poll`]: the adaptive idle-poll window.
//! - [`mesh`]: the message queues between shards, and [`mesh::Shared`],
//!   everything else the shard threads share (built once by `start.rs`).
//! - [`faults`]: test-only fault injection into the log's I/O.

pub mod buf;
pub mod certs;
mod clienttls;
mod clienttls_state;
mod conn;
mod conn_slot;
mod event_loop;
pub mod faults;
mod logio;
mod logio_state;
pub mod mesh;
mod peer;
pub mod poll;
mod port_owner;
mod ring;
mod start;
mod sys;
mod tlsio;
pub mod user_data;

/// Accepted peer links waiting for their TLS handshake and Hello, per
/// shard (a new one evicts the oldest).
pub use peer::links::PENDING_MAX as PEER_PENDING_MAX;

pub use start::Server;
pub use sys::allowed_cpus;
