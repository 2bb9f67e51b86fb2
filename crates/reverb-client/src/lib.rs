//! Native Reverb client: talks to a Reverb server (ours or the reference) over gRPC, or
//! directly when it runs in this process (`transport/`); encodes and decodes chunks; gives
//! every call a deadline. Used by the Python bindings and the TensorFlow kernels.
//!
//! Data path: `writer/` turns appended steps into chunks and items and streams them;
//! `sampler.rs` keeps samples requested and hands out [`PlannedSample`]s (`sample.rs`), which
//! consumers decompress straight into their batches.

mod client;
mod error;
pub mod sample;
pub mod sampler;
pub mod shards;
pub mod signature;
pub mod tensor;
pub mod transport;
pub mod writer;

pub use client::{connect_wait, Client};
pub use error::{ClientError, Result};
pub use sample::{LazyTensor, PlannedSample, Sample};
pub use tensor::Tensor;

use std::sync::atomic::{AtomicPtr, Ordering};

/// The process-wide runtime all clients share (two worker threads). A child made by `fork`
/// (e.g. a PyTorch `DataLoader` worker) inherits no threads, so it gets a runtime of its
/// own on first use; clients created before the fork cannot be used in the child.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    /// A runtime and the process that started it. Never freed: a child of `fork` must not
    /// drop a runtime whose threads live only in its parent.
    struct Owned {
        pid: u32,
        runtime: tokio::runtime::Runtime,
    }
    static CURRENT: AtomicPtr<Owned> = AtomicPtr::new(std::ptr::null_mut());
    let pid = std::process::id();
    let current = CURRENT.load(Ordering::Acquire);
    // SAFETY: CURRENT only ever holds null or a pointer from `Box::leak`, never freed, so a
    // non-null pointer is valid for 'static.
    if let Some(owned) = unsafe { current.as_ref() } {
        if owned.pid == pid {
            return &owned.runtime;
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("reverb-client")
        .enable_all()
        .build()
        .expect("could not start the reverb client runtime");
    let fresh: &'static mut Owned = Box::leak(Box::new(Owned { pid, runtime }));
    match CURRENT.compare_exchange(current, fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => &fresh.runtime,
        Err(winner) => {
            // Another thread of this process installed one first: use it. `fresh` stays
            // leaked (its threads idle), which happens at most once per process.
            // SAFETY: as above, `winner` comes from `Box::leak` and is never freed.
            &unsafe { &*winner }.runtime
        }
    }
}
