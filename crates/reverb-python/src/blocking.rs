//! The one way a binding waits: without the GIL, in slices of at most 100 ms, checking for
//! signals (Ctrl-C) between slices, up to an optional deadline.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use reverb_client::{runtime, ClientError};
use std::future::Future;
use std::time::{Duration, Instant};
use tonic::Code;

/// The longest the GIL is released in one go.
const SLICE: Duration = Duration::from_millis(100);

/// Repeats `step(until)` without the GIL until it returns `Some`, each time with `until` at
/// most one slice away (and never past `deadline`). `Ok(None)` once the deadline passed;
/// a pending signal's exception (e.g. `KeyboardInterrupt`) stops it between slices.
pub(crate) fn slices<T: Send>(
    py: Python<'_>,
    deadline: Option<Instant>,
    mut step: impl FnMut(Instant) -> Option<T> + Send,
) -> PyResult<Option<T>> {
    loop {
        let slice = Instant::now() + SLICE;
        let until = deadline.map_or(slice, |d| d.min(slice));
        if let Some(done) = py.detach(|| step(until)) {
            return Ok(Some(done));
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        py.check_signals()?;
    }
}

/// Runs `fut` to completion on this thread (driven by the client runtime), without the GIL.
/// A signal drops it, cancelling whatever it was doing.
pub(crate) fn run<T: Send>(
    py: Python<'_>,
    fut: impl Future<Output = reverb_client::Result<T>> + Send,
) -> PyResult<T> {
    let mut fut = std::pin::pin!(fut);
    let done = slices(py, None, |until| {
        let until = tokio::time::Instant::from_std(until);
        // A panic is a failed call, not a `PanicException` that `except Exception` misses.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime().block_on(async { tokio::time::timeout_at(until, fut.as_mut()).await.ok() })
        }))
        .unwrap_or_else(|_| {
            Some(Err(ClientError::new(
                Code::Internal,
                "reverb client call panicked",
            )))
        })
    })?;
    done.expect("no deadline")
        .map_err(crate::errors::client_error)
}

/// A timeout in seconds: `None` or 0 mean none.
pub(crate) fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t > 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(0.0) => Ok(None),
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout must be >= 0 seconds, got {t}"
        ))),
    }
}

/// The deadline of a timeout in milliseconds (`None`: no deadline).
pub(crate) fn deadline_ms(timeout_ms: Option<i64>) -> PyResult<Option<Instant>> {
    match timeout_ms {
        None => Ok(None),
        Some(ms) if ms >= 0 => Ok(Some(Instant::now() + Duration::from_millis(ms as u64))),
        Some(ms) => Err(PyValueError::new_err(format!(
            "timeout_ms must be >= 0, got {ms}"
        ))),
    }
}
