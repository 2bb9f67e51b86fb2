//! The Reverb replay engine: tables of prioritized items referencing shared, reference-counted
//! chunks; item selectors; rate limiters; chunk payloads on disk (`chunk_store` over
//! `segment_log`: the only I/O). No async runtime.

pub mod checkpoint;
pub mod chunk;
pub mod chunk_store;
pub mod error;
pub mod journal;
pub mod keymap;
pub mod rate_limiter;
pub mod rows;
pub mod segment_log;
pub mod selectors;
pub mod table;

pub use chunk::{Chunk, ItemData, RowRef, RunShape, Trajectory};
pub use chunk_store::ChunkStore;
pub use error::{CoreError, Result};
pub use journal::Journal;
pub use rate_limiter::{RateLimiter, RateLimiterConfig};
pub use selectors::{Selector, SelectorKind};
pub use table::{
    BlockReason, Draw, InsertOutcome, SampledItem, Table, TableConfig, TableSnapshot, Waiter,
    Waiting,
};

#[cfg(test)]
mod table_tests;
#[cfg(test)]
mod test_dir;
