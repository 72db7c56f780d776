//! The lock core: IO-free, deterministic state (see [`table`]); its
//! contract types are in [`types`].

pub mod budget;
pub mod endpoint;
pub mod idmap;
pub mod index;
pub mod list;
pub mod name;
// CRC32C comes with the server: the client alone routes nothing.
#[cfg(feature = "server")]
pub mod route;
pub mod table;
pub mod types;

pub use budget::Budget;
pub use endpoint::Endpoint;
pub use name::{Arena, Name, NameRef, Source, KEY_MAX, LOCK_PORT_SOURCE_MAX, SOURCE_MAX};
pub use table::Table;
pub use types::{
    Access, Checked, Effect, Effects, Extended, HeldKey, HeldRef, HoldMode, Limit, Limits,
    ListForm, LockMode, LockOpts, Now, Proclaimed, Queued, ReleaseCause, Reply, Token, NO_CONN,
    REPLICATED_SESSION,
};
