//! The one way a binding waits: without the GIL, in slices of at most 100 ms, checking for
//! signals (Ctrl-C) between slices, up to an optional deadline; and how it takes a native
//! writer's lock (at once while it is free, else without the GIL).

use crate::errors::{client_error, IntoPyResult};
use crate::numpy::Array;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use reverb_client::tensor::{AsView, TensorView};
use reverb_client::{runtime, ClientError, Tensor};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::task::{Context, Poll, Waker};
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

/// Runs `fut` to completion on the client runtime's workers, waiting without the GIL. A
/// signal aborts it, cancelling whatever it was doing. Network calls must run there: driven
/// from a Python thread (`run_here`), tonic/h2 calls on one connection failed with
/// ENHANCE_YOUR_CALM after a few thousand calls.
pub(crate) fn run<T: Send + 'static>(
    py: Python<'_>,
    fut: impl Future<Output = reverb_client::Result<T>> + Send + 'static,
) -> PyResult<T> {
    let mut handle = runtime().spawn(fut);
    let abort = handle.abort_handle();
    // Most calls are answered within a round trip: the first slice watches for the answer a
    // little before sleeping, so the worker that finishes the call need not wake this thread.
    let mut watched = false;
    let joined = slices(py, None, |until| {
        if !std::mem::replace(&mut watched, true) {
            if let Some(done) = spin_on(&mut handle) {
                return Some(done);
            }
        }
        let until = tokio::time::Instant::from_std(until);
        runtime().block_on(async { tokio::time::timeout_at(until, &mut handle).await.ok() })
    });
    match joined {
        Ok(done) => done
            .expect("no deadline")
            .unwrap_or_else(|e| Err(join_error(e)))
            .map_err(crate::errors::client_error),
        Err(signal) => {
            abort.abort();
            Err(signal)
        }
    }
}

/// How long a waiting thread watches for an answer before it sleeps.
const SPIN: Duration = Duration::from_micros(150);

/// Polls `handle` for up to [`SPIN`], yielding the CPU between polls; its output if the task
/// finished by then. (Sleeping and being woken costs tens of microseconds on a busy or
/// virtual machine: more than a round trip to a server on the same host.)
fn spin_on<T>(
    handle: &mut tokio::task::JoinHandle<T>,
) -> Option<Result<T, tokio::task::JoinError>> {
    let start = Instant::now();
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(done) = Pin::new(&mut *handle).poll(&mut cx) {
            return Some(done);
        }
        if start.elapsed() >= SPIN {
            return None;
        }
        std::thread::yield_now();
    }
}

/// The error of a call whose task did not finish.
pub(crate) fn join_error(e: tokio::task::JoinError) -> ClientError {
    let why = if e.is_panic() {
        "panicked"
    } else {
        "was cancelled"
    };
    ClientError::new(Code::Internal, format!("reverb client call {why}"))
}

/// Runs a call of `client`: on this thread ([`run_here`]) when it reaches a server of this
/// process, else on the client runtime ([`run`]).
pub(crate) fn run_for<T: Send + 'static>(
    py: Python<'_>,
    client: &reverb_client::Client,
    fut: impl Future<Output = reverb_client::Result<T>> + Send + 'static,
) -> PyResult<T> {
    if client.inproc().is_some() {
        run_here(py, fut)
    } else {
        run(py, fut)
    }
}

/// Runs `fut` to completion on this thread (timers and I/O driven by the client runtime),
/// without the GIL: one thread hop less than [`run`], for calls that stay in this process. A
/// signal drops it, cancelling whatever it was doing.
pub(crate) fn run_here<T: Send>(
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
        .unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Some(Err(ClientError::new(
                Code::Internal,
                format!("reverb client call panicked: {why}"),
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

/// Runs `f` on a locked writer: directly if the lock is free, otherwise without the GIL.
pub(crate) fn locked<W: Send, T: Send>(
    py: Python<'_>,
    lock: &Mutex<W>,
    f: impl FnOnce(&mut W) -> T + Send,
) -> T {
    if let Ok(mut w) = lock.try_lock() {
        return f(&mut w);
    }
    py.detach(|| f(&mut lock.lock().unwrap()))
}

/// Runs `f` on a locked writer with views of `arrays`: read in place while the GIL is held
/// when the lock is free, else copied first (the wait for the lock releases the GIL).
pub(crate) fn with_views<W: Send, T: Send>(
    py: Python<'_>,
    lock: &Mutex<W>,
    arrays: &[Array<'_>],
    f: impl for<'a> FnOnce(&mut W, &[TensorView<'a>]) -> T + Send,
) -> T {
    if let Ok(mut w) = lock.try_lock() {
        return on_views(py, &mut *w, arrays, f);
    }
    let owned: Vec<Tensor> = arrays.iter().map(|a| a.to_tensor(py)).collect();
    py.detach(|| {
        let views: Vec<TensorView<'_>> = owned.iter().map(AsView::view).collect();
        f(&mut lock.lock().unwrap(), &views)
    })
}

/// Runs `f` (native writer code, which runs no Python code) on `w` with views of `arrays`
/// read in place, the GIL held (`_py`) throughout.
pub(crate) fn on_views<W, T>(
    _py: Python<'_>,
    w: &mut W,
    arrays: &[Array<'_>],
    f: impl for<'a> FnOnce(&mut W, &[TensorView<'a>]) -> T,
) -> T {
    // SAFETY: the GIL is held for the whole call and `f` runs no Python code; the views
    // cannot outlive it (`f` is generic over their lifetime).
    let views: Vec<TensorView<'_>> = arrays.iter().map(|a| unsafe { a.view() }).collect();
    f(w, &views)
}

/// `lock`'s guard, taken with the GIL held when it is free, else waited for without the GIL
/// (its holder may need the GIL to let go). A lock whose holder panicked is taken as it is.
pub(crate) fn lock_with_gil<'a, W: Send>(py: Python<'_>, lock: &'a Mutex<W>) -> MutexGuard<'a, W> {
    loop {
        match lock.try_lock() {
            Ok(guard) => return guard,
            Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => py.detach(|| drop(lock.lock())),
        }
    }
}

/// Repeats a bounded wait on a locked writer (`step` until a time; true when done) until
/// done or `deadline`; DeadlineExceededError naming `what` after it, and what the writer's
/// insert stream is retrying after (`retrying`), if anything.
pub(crate) fn wait_locked<W: Send>(
    py: Python<'_>,
    lock: &Mutex<W>,
    deadline: Option<Instant>,
    what: &str,
    retrying: impl FnOnce(&W) -> Option<ClientError>,
    mut step: impl FnMut(&mut W, Option<Instant>) -> reverb_client::Result<bool> + Send,
) -> PyResult<()> {
    let done = slices(py, deadline, |until| {
        match step(&mut lock.lock().unwrap(), Some(until)) {
            Ok(false) => None,
            done => Some(done),
        }
    })?;
    match done {
        Some(done) => done.py().map(|_| ()),
        None => {
            let why = match retrying(&lock_with_gil(py, lock)) {
                Some(e) => format!(
                    "; the insert stream is retrying after {:?}: {}",
                    e.code, e.message
                ),
                None => String::new(),
            };
            Err(client_error(ClientError::deadline(format!(
                "Timeout exceeded: {what} did not complete in time{why}"
            ))))
        }
    }
}
