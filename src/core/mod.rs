//! The lock core: IO-free, deterministic state (see [`table`]).

pub mod list;
pub mod name;
pub mod table;

pub use name::{Name, NAME_MAX};
pub use table::{
    Effect, Effects, Grant, HeldKey, Limit, Limits, LockMode, Now, ReleaseCause, Reply, Table,
    Token, NO_CONN,
};
