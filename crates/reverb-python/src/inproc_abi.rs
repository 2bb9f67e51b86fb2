//! The C ABI through which the TensorFlow kernel library (a separate `.so`, with a registry of
//! its own) samples the servers of this process: `reverb_inproc_sample_v3`, found with `dlsym`
//! (see `reverb_client::transport::inproc::abi`). Python's own clients reach the servers
//! directly, never through here.

use crate::client::inproc_allowed;
use prost::Message;
use pyo3::prelude::*;
use reverb_client::runtime;
use reverb_client::transport::inproc::abi::{EmitFn, SharedData, CHUNK, ERROR, INFO, SHARED_DATA};
use reverb_client::transport::inproc::loopback_port;
use reverb_proto::inproc::SampledBatch;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::Status;

/// The port of `address` when it names a server running in this process that a client
/// holding `auth_token` (by default `REVERB_AUTH_TOKEN`'s) may call, and in-process calls
/// are allowed; else `None`. The TensorFlow kernels then sample it through
/// `reverb_inproc_sample_v3`.
#[pyfunction]
#[pyo3(signature = (address, auth_token=None))]
pub(crate) fn inproc_port(py: Python<'_>, address: &str, auth_token: Option<&str>) -> Option<u16> {
    let port = loopback_port(address).filter(|_| inproc_allowed(py))?;
    let token = auth_token
        .map(str::to_string)
        .or_else(reverb_proto::env_auth_token);
    reverb_proto::inproc::lookup(port)
        .filter(|server| server.accepts(token.as_deref()))
        .map(|_| port)
}

/// Releases chunk bytes lent by `reverb_inproc_sample_v3`.
///
/// # Safety
/// `owner` comes from `Arc::into_raw` on an `Arc<bytes::Bytes>`, and is released exactly once.
unsafe extern "C" fn release_bytes(owner: *const std::ffi::c_void) {
    // SAFETY: see above.
    drop(unsafe { Arc::from_raw(owner as *const bytes::Bytes) });
}

/// How often a waiting call looks at its caller's cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(5);

/// Up to `max_items` samples of `table` from the server of this process on `port`, waiting
/// at most `wait`: an empty batch when the wait passed or `cancel` was set. No item is taken
/// once the flag is seen set.
fn sample(
    port: u16,
    table: &str,
    max_items: usize,
    wait: Duration,
    cancel: &AtomicBool,
) -> Result<Vec<reverb_proto::held::HeldSample>, Status> {
    let cancelled = || cancel.load(Ordering::Acquire);
    let server = reverb_proto::inproc::lookup(port)
        .ok_or_else(|| Status::unavailable(format!("No server of this process on port {port}")))?;
    if cancelled() {
        return Ok(Vec::new());
    }
    // Samples that are there are taken without a trip through the runtime (a wait registers
    // with the table and its timer, so only a blocked rate limiter needs one).
    {
        // (The runtime context lets the zero wait make its timer when nothing is there.)
        let _context = runtime().enter();
        let mut now = std::pin::pin!(held(server.sample(
            table,
            max_items,
            Some(Duration::ZERO),
            false
        )));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        match now.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(Ok(batch)) => return Ok(batch),
            std::task::Poll::Ready(Err(e)) if e.code() != tonic::Code::DeadlineExceeded => {
                return Err(e)
            }
            _ => {}
        }
    }
    runtime().block_on(async {
        let sampled =
            tokio::time::timeout(wait, held(server.sample(table, max_items, None, false)));
        // Looks at the flag at every poll (and at least every CANCEL_POLL).
        let mut tick = tokio::time::interval(CANCEL_POLL);
        let cancel = std::future::poll_fn(|cx| {
            if cancelled() {
                return std::task::Poll::Ready(());
            }
            while tick.poll_tick(cx).is_ready() {}
            std::task::Poll::Pending
        });
        // Biased: every wake-up of this task looks at the flag before the wait for items may
        // take any.
        tokio::select! {
            biased;
            () = cancel => Ok(Vec::new()),
            batch = sampled => batch.unwrap_or_else(|_| Ok(Vec::new())),
        }
    })
}

/// The held samples of a batch asked for without columns.
async fn held(
    sampled: impl std::future::Future<Output = Result<SampledBatch, Status>>,
) -> Result<Vec<reverb_proto::held::HeldSample>, Status> {
    match sampled.await? {
        SampledBatch::Held(held) => Ok(held),
        SampledBatch::Columns(_) => Err(Status::internal("columns came, not asked for")),
    }
}

/// In-process sampling for clients built into other libraries (the TensorFlow kernels): up to
/// `max_items` samples of `table` from this process's server on `port`, waiting at most
/// `wait_ms` for the first, handed to `emit` piece by piece, chunk bytes lent rather than
/// copied. Once `*cancel` is set the call takes no more items and returns. Returns a status
/// code (0: OK).
///
/// # Safety
/// `table` must point at `table_len` readable bytes; `cancel` at an `AtomicBool` that lives
/// for the call; `sink` is passed back to `emit` as is.
#[no_mangle]
pub unsafe extern "C" fn reverb_inproc_sample_v3(
    port: u16,
    table: *const u8,
    table_len: usize,
    max_items: usize,
    wait_ms: u64,
    cancel: *const AtomicBool,
    sink: *mut std::ffi::c_void,
    emit: EmitFn,
) -> i32 {
    // SAFETY: the caller passes `table_len` readable bytes at `table`, and a live flag at
    // `cancel` (shared: only read here, through atomic loads).
    let (name, cancel) = unsafe { (std::slice::from_raw_parts(table, table_len), &*cancel) };
    let result = std::panic::catch_unwind(|| {
        let name = std::str::from_utf8(name)
            .map_err(|_| Status::invalid_argument("table name is not UTF-8"))?;
        sample(
            port,
            name,
            max_items,
            Duration::from_millis(wait_ms),
            cancel,
        )
    });
    let send = |kind: u32, bytes: &[u8]| {
        // SAFETY: `emit` and `sink` come from the caller, which reads `bytes` only during
        // the call.
        unsafe { emit(sink, kind, bytes.as_ptr(), bytes.len()) }
    };
    match result {
        Ok(Ok(samples)) => {
            for s in samples {
                let (info, chunks) = s.to_wire();
                send(INFO, &info.encode_to_vec());
                for mut chunk in chunks {
                    let data = Arc::new(std::mem::take(&mut chunk.data));
                    send(CHUNK, &chunk.encode_to_vec());
                    // The bytes are lent, not copied: the receiver holds a reference on them
                    // until it is done.
                    let lent = SharedData {
                        data: data.as_ptr(),
                        len: data.len(),
                        owner: Arc::into_raw(data) as *const std::ffi::c_void,
                        release: release_bytes,
                    };
                    // SAFETY: viewing a live, initialized `repr(C)` struct as its bytes for the
                    // duration of the call.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(
                            &lent as *const SharedData as *const u8,
                            std::mem::size_of::<SharedData>(),
                        )
                    };
                    send(SHARED_DATA, bytes);
                }
            }
            0
        }
        Ok(Err(status)) => {
            send(ERROR, status.message().as_bytes());
            status.code() as i32
        }
        Err(_) => {
            send(ERROR, b"in-process sampling panicked");
            tonic::Code::Internal as i32
        }
    }
}
