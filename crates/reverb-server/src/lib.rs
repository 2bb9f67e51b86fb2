//! The Reverb gRPC service over `reverb-core` tables, and a server you can start and stop.
//!
//! Data path: `InsertStream` stores chunk bytes per stream and inserts items into tables
//! (waiting, not buffering, while a rate limiter blocks); `SampleStream` samples batches from a
//! table and streams chunk bytes back without decoding them.

pub mod checkpointer;
mod insert;
pub mod local;
mod sample;
mod server;
mod service;
mod shm;

pub use checkpointer::Checkpointer;
pub use server::{Server, ServerOptions};
pub use service::ReverbServiceImpl;

use reverb_core::CoreError;
use tonic::Status;

/// What a sample that waited `rate_limiter_timeout` for the rate limiter in vain fails with
/// (the reference's text), over gRPC and in-process alike.
pub const RATE_LIMITER_TIMEOUT: &str =
    "Rate Limiter: Timeout exceeded before the right to sample was acquired.";

/// Maps an engine error to its gRPC status.
pub(crate) fn status(e: CoreError) -> Status {
    match e {
        CoreError::InvalidArgument(m) => Status::invalid_argument(m),
        CoreError::NotFound(m) => Status::not_found(m),
        CoreError::FailedPrecondition(m) => Status::failed_precondition(m),
    }
}
