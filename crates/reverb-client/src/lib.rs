//! Native Reverb client: talks gRPC to a Reverb server (ours or the reference), encodes and
//! decodes chunks, and gives every call a deadline. Used by the Python bindings.

mod client;
mod error;
pub mod local;
pub mod sampler;
pub mod tensor;
pub mod writer;

pub use client::{Client, Sample};
pub use error::{ClientError, Result};
pub use tensor::Tensor;

use std::sync::OnceLock;

/// The process-wide runtime all clients share (two worker threads).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("reverb-client")
            .enable_all()
            .build()
            .expect("could not start the reverb client runtime")
    })
}
