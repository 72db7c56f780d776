//! Support code for the side-by-side benchmark (`scripts/bench.sh`):
//! - [`frame`]: Locking-Center frame boundaries, for the floor server;
//! - [`json`]: a minimal JSON reader for the load generator's `--json` lines;
//! - [`svg`]: percentile plots written as plain SVG (no plotting stack needed);
//! - [`ops`]: what clients saw during a rolling restart or a node
//!   replacement (`cluster-ops`); [`ops_table`]: its markdown tables.

pub mod frame;
pub mod json;
pub mod ops;
pub mod ops_table;
pub mod svg;
