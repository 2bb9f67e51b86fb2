//! The Reverb server: the gRPC service (tonic) and the in-process service over `reverb-core`
//! tables, and a server you can start and stop.
//!
//! Data path: `InsertStream` (`insert_stream.rs`) stores chunk bytes per stream and inserts
//! items into tables (waiting, not buffering, while a rate limiter blocks); `SampleStream`
//! (`sample_stream.rs`) samples batches from a table and streams chunk bytes back without
//! decoding them, inline or through a shared-memory ring a client on this host offers (`shm`).
//! Besides gRPC (`service.rs`), `transport/` holds the other way a client reaches the tables:
//! direct calls from a client of the same process (`inproc`).

pub mod alloc;
mod auth;
mod budget;
pub mod checkpointer;
pub mod dm_checkpoint;
mod insert_stream;
pub mod metrics;
mod sample_stream;
mod server;
mod service;
mod shm;
mod status;
mod tables;
mod tls;
mod transport;

pub use alloc::HugePageAlloc;
pub use auth::AUTHORIZATION;
pub use checkpointer::Checkpointer;
pub use server::{Server, ServerOptions, StartError, StorageOptions};
pub use service::ReverbServiceImpl;
pub use status::RATE_LIMITER_TIMEOUT;
pub use tables::Tables;
pub use tls::ServerTls;
