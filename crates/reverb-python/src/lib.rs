//! `reverb._native`: the Python face of the engine, server and client.
//!
//! Python never sees gRPC: it hands numpy buffers in and gets numpy buffers back. Every
//! blocking call releases the GIL and wakes every 100 ms to let Ctrl-C through.

use numpy::{PyArray1, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use prost::Message;
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use reverb_client::local::{loopback_port, EmitFn, Local};
use reverb_client::sampler::{stack, Sampler, SamplerOptions};
use reverb_client::writer::{AppendError, ItemColumn, Steps, TrajectoryWriter, WriterOptions};
use reverb_client::{runtime, Client, ClientError, Sample, Tensor};
use reverb_core::{CoreError, RateLimiterConfig, SelectorKind, Table, TableConfig};
use reverb_server::{Checkpointer, Server, ServerOptions};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Code;

/// Raises the `reverb.errors` class matching a client error.
fn client_err(e: ClientError) -> PyErr {
    let class = match e.code {
        Code::InvalidArgument => return PyValueError::new_err(e.message),
        Code::Unimplemented => return PyNotImplementedError::new_err(e.message),
        Code::DeadlineExceeded => "DeadlineExceededError",
        Code::NotFound => "NotFoundError",
        Code::Unavailable => "UnavailableError",
        _ => "ReverbError",
    };
    Python::attach(
        |py| match py.import("reverb.errors").and_then(|m| m.getattr(class)) {
            Ok(cls) => PyErr::from_value(
                cls.call1((e.message,))
                    .unwrap_or_else(|err| err.into_value(py).into_bound(py).into_any()),
            ),
            Err(_) => PyRuntimeError::new_err(e.message),
        },
    )
}

fn core_err(e: CoreError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t > 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(0.0) => Ok(None),
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout must be >= 0 seconds, got {t}"
        ))),
    }
}

/// Runs `fut` on the client runtime without the GIL, checking for signals every 100 ms.
fn wait<T: Send + 'static>(
    py: Python<'_>,
    fut: impl Future<Output = reverb_client::Result<T>> + Send + 'static,
) -> PyResult<T> {
    let mut handle = runtime().spawn(fut);
    loop {
        let joined = py.detach(|| {
            runtime().block_on(async {
                tokio::time::timeout(Duration::from_millis(100), &mut handle)
                    .await
                    .ok()
            })
        });
        match joined {
            Some(Ok(result)) => return result.map_err(client_err),
            Some(Err(e)) => {
                return Err(PyRuntimeError::new_err(format!(
                    "reverb client task failed: {e}"
                )))
            }
            None => {
                if let Err(e) = py.check_signals() {
                    handle.abort();
                    return Err(e);
                }
            }
        }
    }
}

fn selector(spec: (String, f64)) -> PyResult<SelectorKind> {
    Ok(match spec.0.as_str() {
        "uniform" => SelectorKind::Uniform,
        "prioritized" => SelectorKind::Prioritized {
            priority_exponent: spec.1,
        },
        "fifo" => SelectorKind::Fifo,
        "lifo" => SelectorKind::Lifo,
        "min_heap" => SelectorKind::MinHeap,
        "max_heap" => SelectorKind::MaxHeap,
        other => {
            return Err(PyValueError::new_err(format!(
                "Unknown selector kind '{other}'"
            )))
        }
    })
}

/// A replay table (the engine's), usable before and while a server serves it.
#[pyclass(name = "Table", module = "reverb._native", frozen)]
struct PyTable {
    inner: Arc<Table>,
}

#[pymethods]
impl PyTable {
    #[new]
    #[pyo3(signature = (name, sampler, remover, max_size, max_times_sampled, rate_limiter, signature=None))]
    fn new(
        name: String,
        sampler: (String, f64),
        remover: (String, f64),
        max_size: i64,
        max_times_sampled: i32,
        rate_limiter: (f64, i64, f64, f64),
        signature: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        let config = TableConfig {
            name,
            sampler: selector(sampler)?,
            remover: selector(remover)?,
            max_size,
            max_times_sampled,
            rate_limiter: RateLimiterConfig {
                samples_per_insert: rate_limiter.0,
                min_size_to_sample: rate_limiter.1,
                min_diff: rate_limiter.2,
                max_diff: rate_limiter.3,
            },
            signature: signature.map(Into::into),
        };
        Ok(Self {
            inner: Arc::new(Table::new(config).map_err(core_err)?),
        })
    }

    /// The table's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// Serialized `TableInfo`.
    fn info<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.info().encode_to_vec())
    }

    /// Whether the rate limiter allows `n` samples now.
    fn can_sample(&self, n: i64) -> bool {
        self.inner.can_sample(n)
    }

    /// Whether the rate limiter allows `n` inserts now.
    fn can_insert(&self, n: i64) -> bool {
        self.inner.can_insert(n)
    }

    /// Number of items stored.
    fn size(&self) -> usize {
        self.inner.size()
    }
}

/// A gRPC server serving tables on a port.
#[pyclass(name = "Server", module = "reverb._native", frozen)]
struct PyServer {
    inner: Server,
}

#[pymethods]
impl PyServer {
    #[new]
    /// Restores the latest checkpoint under `checkpoint_root` (or `fallback_checkpoint_path`)
    /// before serving; `Checkpoint` calls save there, keeping `keep_latest`.
    #[pyo3(signature = (tables, port=0, checkpoint_root=None, fallback_checkpoint_path=None, keep_latest=1))]
    fn new(
        py: Python<'_>,
        tables: Vec<PyRef<'_, PyTable>>,
        port: u16,
        checkpoint_root: Option<std::path::PathBuf>,
        fallback_checkpoint_path: Option<std::path::PathBuf>,
        keep_latest: usize,
    ) -> PyResult<Self> {
        let tables: Vec<Arc<Table>> = tables.iter().map(|t| t.inner.clone()).collect();
        let checkpointer = checkpoint_root.map(|root| {
            Arc::new(Checkpointer::new(
                root,
                fallback_checkpoint_path,
                keep_latest,
            ))
        });
        let options = ServerOptions {
            port,
            checkpointer,
            ..ServerOptions::default()
        };
        let inner = py
            .detach(|| Server::start(tables, options))
            .map_err(PyValueError::new_err)?;
        Ok(Self { inner })
    }

    /// The port being served.
    #[getter]
    fn port(&self) -> u16 {
        self.inner.port()
    }

    /// Stops the server (open streams end with an error on the client side).
    fn stop(&self, py: Python<'_>) {
        py.detach(|| self.inner.stop());
    }

    /// Blocks until the server stops, or `timeout` seconds pass; returns whether it stopped.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = seconds(timeout)?.map(|t| std::time::Instant::now() + t);
        loop {
            if py.detach(|| self.inner.wait(Duration::from_millis(100))) {
                return Ok(true);
            }
            py.check_signals()?;
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(false);
            }
        }
    }
}

/// A client of one server address.
#[pyclass(name = "Client", module = "reverb._native", frozen)]
struct PyClient {
    inner: Client,
}

fn column_out<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyTuple>> {
    let data = PyArray1::from_vec(py, t.data);
    PyTuple::new(
        py,
        [
            t.dtype.into_pyobject(py)?.into_any(),
            PyList::new(py, t.shape)?.into_any(),
            data.into_any(),
        ],
    )
}

/// Samples as Python sees them: a list of
/// `((key, probability, table_size, priority, times_sampled), [(dtype, shape, data)])`.
fn samples_out(py: Python<'_>, samples: Vec<Sample>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for s in samples {
        let item = s.info.item.unwrap_or_default();
        let info = (
            item.key,
            s.info.probability,
            s.info.table_size,
            item.priority,
            item.times_sampled,
        );
        let columns = s
            .columns
            .into_iter()
            .map(|t| column_out(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        out.append((info, PyList::new(py, columns)?))?;
    }
    Ok(out)
}

#[pymethods]
impl PyClient {
    #[new]
    fn new(py: Python<'_>, address: &str) -> PyResult<Self> {
        read_no_local(py);
        Ok(Self {
            inner: Client::new(address).map_err(client_err)?,
        })
    }

    /// The server address.
    #[getter]
    fn address(&self) -> &str {
        self.inner.address()
    }

    /// Serialized `TableInfo` of every table.
    #[pyo3(signature = (timeout=None))]
    fn server_info<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let c = self.inner.clone();
        let timeout = seconds(timeout)?;
        let infos = wait(py, async move { c.server_info(timeout).await })?;
        Ok(infos
            .iter()
            .map(|i| PyBytes::new(py, &i.encode_to_vec()))
            .collect())
    }

    /// Deletes `deletes` then updates priorities.
    #[pyo3(signature = (table, updates, deletes, timeout=None))]
    fn mutate_priorities(
        &self,
        py: Python<'_>,
        table: String,
        updates: Vec<(u64, f64)>,
        deletes: Vec<u64>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let c = self.inner.clone();
        let timeout = seconds(timeout)?;
        if let Some(local) = local_server(c.address()) {
            return py
                .detach(|| {
                    reverb_server::local::mutate_priorities(local.port, &table, &updates, &deletes)
                })
                .map_err(|s| client_err(ClientError::from_status(s, c.address())));
        }
        wait(py, async move {
            c.mutate_priorities(&table, updates, deletes, timeout).await
        })
    }

    /// Empties a table.
    #[pyo3(signature = (table, timeout=None))]
    fn reset(&self, py: Python<'_>, table: String, timeout: Option<f64>) -> PyResult<()> {
        let c = self.inner.clone();
        let timeout = seconds(timeout)?;
        if let Some(local) = local_server(c.address()) {
            return py
                .detach(|| reverb_server::local::reset(local.port, &table))
                .map_err(|s| client_err(ClientError::from_status(s, c.address())));
        }
        wait(py, async move { c.reset(&table, timeout).await })
    }

    /// Asks the server to checkpoint; returns the path.
    #[pyo3(signature = (timeout=None))]
    fn checkpoint(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<String> {
        let c = self.inner.clone();
        let timeout = seconds(timeout)?;
        wait(py, async move { c.checkpoint(timeout).await })
    }

    /// Samples `num_samples` items. Returns `(samples, error)`: a list of
    /// `((key, probability, table_size, priority, times_sampled), [(dtype, shape, bytes)])`
    /// and the exception that stopped the call part-way (or None).
    #[pyo3(signature = (table, num_samples, rate_limiter_timeout=None, timeout=None))]
    fn sample<'py>(
        &self,
        py: Python<'py>,
        table: String,
        num_samples: usize,
        rate_limiter_timeout: Option<f64>,
        timeout: Option<f64>,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyAny>)> {
        let c = self.inner.clone();
        let timeout = seconds(timeout)?;
        let rl_timeout = seconds(rate_limiter_timeout)?;
        let (samples, failure) = match local_server(c.address()) {
            Some(local) => {
                local_sample(py, &c, local.port, &table, num_samples, rl_timeout, timeout)?
            }
            None => wait(py, async move {
                c.sample_partial(&table, num_samples, rl_timeout, timeout)
                    .await
            })?,
        };
        let out = samples_out(py, samples)?;
        let failure = match failure {
            Some(e) => client_err(e).into_value(py).into_bound(py).into_any(),
            None => py.None().into_bound(py),
        };
        Ok((out, failure))
    }
}

/// `Client.sample` from a server of this process, without gRPC: the semantics of
/// `Client::sample_partial` (each sample waits at most `rate_limiter_timeout` for the rate
/// limiter, the whole call at most `timeout`; samples that arrived are returned with the
/// error that stopped the call). Waits in slices, letting Ctrl-C through.
fn local_sample(
    py: Python<'_>,
    client: &Client,
    port: u16,
    table: &str,
    num_samples: usize,
    rate_limiter_timeout: Option<Duration>,
    timeout: Option<Duration>,
) -> PyResult<(Vec<Sample>, Option<ClientError>)> {
    if num_samples == 0 {
        return Err(client_err(ClientError::invalid("num_samples must be >= 1")));
    }
    let start = Instant::now();
    let deadline = timeout.map(|t| start + t);
    let mut samples = Vec::with_capacity(num_samples);
    let mut rate_limited_since = Instant::now();
    while samples.len() < num_samples {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            let e = client.expired("SampleStream", timeout.unwrap_or_default());
            return Ok((samples, Some(e)));
        }
        let rate_limit_end = rate_limiter_timeout.map(|t| rate_limited_since + t);
        if rate_limit_end.is_some_and(|d| now >= d) {
            let e = ClientError::deadline(reverb_server::RATE_LIMITER_TIMEOUT);
            return Ok((samples, Some(e)));
        }
        let mut wait = Duration::from_millis(100);
        for end in [deadline, rate_limit_end].into_iter().flatten() {
            wait = wait.min(end - now);
        }
        let want = num_samples - samples.len();
        let got = py.detach(|| {
            reverb_server::local::sample(port, table, want, wait).and_then(|items| {
                items
                    .into_iter()
                    .map(|s| {
                        let chunks: Vec<_> =
                            s.item.chunks.iter().map(|c| c.data().clone()).collect();
                        Sample::from_chunks(s.info(), &chunks)
                            .map_err(|e| tonic::Status::new(e.code, e.message))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
        });
        match got {
            Ok(got) if got.is_empty() => py.check_signals()?,
            Ok(got) => {
                samples.extend(got);
                rate_limited_since = Instant::now();
            }
            Err(status) => {
                let e = ClientError::from_status(status, client.address());
                if samples.is_empty() {
                    return Err(client_err(e));
                }
                return Ok((samples, Some(e)));
            }
        }
    }
    Ok((samples, None))
}

/// NumPy type numbers (`dtype.num`) to TensorFlow DataType values.
fn tf_dtype_of_numpy(num: i32) -> Option<i32> {
    Some(match num {
        0 => 10,      // bool
        1 => 6,       // int8
        2 => 4,       // uint8
        3 => 5,       // int16
        4 => 17,      // uint16
        5 => 3,       // int32
        6 => 22,      // uint32
        7 | 9 => 9,   // long / longlong: int64 on LP64
        8 | 10 => 23, // ulong / ulonglong: uint64
        11 => 1,      // float32
        12 => 2,      // float64
        14 => 8,      // complex64
        15 => 18,     // complex128
        23 => 19,     // float16
        _ => return None,
    })
}

/// Converts any numpy-convertible value to a tensor (one copy of its bytes).
fn to_tensor(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let array = match value.downcast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        // Scalars and sequences: numpy decides the dtype, as in the reference.
        Err(_) => numpy_module(py)?
            .call_method1(intern!(py, "asarray"), (value,))?
            .downcast_into::<PyUntypedArray>()?,
    };
    let array = if array.is_c_contiguous() {
        array
    } else {
        // (ascontiguousarray only changes the shape of 0-d arrays, which are always contiguous.)
        numpy_module(py)?
            .call_method1(intern!(py, "ascontiguousarray"), (array,))?
            .downcast_into::<PyUntypedArray>()?
    };
    let array = if array.dtype().is_native_byteorder() == Some(false) {
        let native = array
            .dtype()
            .call_method1(intern!(py, "newbyteorder"), ("=",))?;
        array
            .call_method1(intern!(py, "astype"), (native,))?
            .downcast_into::<PyUntypedArray>()?
    } else {
        array
    };
    let descr = array.dtype();
    let dtype = tf_dtype_of_numpy(descr.num()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "Unsupported dtype {} (strings and objects are not supported yet)",
            descr
        ))
    })?;
    let shape: Vec<i64> = array.shape().iter().map(|&d| d as i64).collect();
    let nbytes = array.len() * descr.itemsize();
    // SAFETY: the array is C-contiguous, holds `len * itemsize` bytes at `data`, and stays
    // alive and unmodified while we copy: we hold a reference to it and the GIL.
    let data = unsafe {
        let ptr = (*array.as_array_ptr()).data as *const u8;
        if nbytes == 0 {
            Vec::new()
        } else {
            std::slice::from_raw_parts(ptr, nbytes).to_vec()
        }
    };
    Ok(Tensor { dtype, shape, data })
}

fn numpy_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: pyo3::sync::PyOnceLock<Py<PyModule>> = pyo3::sync::PyOnceLock::new();
    Ok(NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

fn deadline(timeout_ms: Option<i64>) -> PyResult<Option<Instant>> {
    match timeout_ms {
        None => Ok(None),
        Some(ms) if ms >= 0 => Ok(Some(Instant::now() + Duration::from_millis(ms as u64))),
        Some(ms) => Err(PyValueError::new_err(format!(
            "timeout_ms must be >= 0, got {ms}"
        ))),
    }
}

fn append_error(py: Python<'_>, e: AppendError) -> PyResult<Option<Py<PyTuple>>> {
    Ok(Some(match e {
        AppendError::AlreadySet(c) => ("already_set", c).into_pyobject(py)?.unbind(),
        AppendError::Mismatch {
            column,
            expected,
            got,
        } => ("mismatch", column, expected.0, expected.1, got.0, got.1)
            .into_pyobject(py)?
            .unbind(),
        AppendError::Other(e) => return Err(client_err(e)),
    }))
}

/// Native half of `reverb.TrajectoryWriter`. Calls from several threads are serialized.
#[pyclass(name = "TrajectoryWriter", module = "reverb._native", frozen)]
struct PyTrajectoryWriter {
    inner: Mutex<TrajectoryWriter>,
}

impl PyTrajectoryWriter {
    /// Runs `f` on the writer: directly if the lock is free, otherwise without the GIL.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut TrajectoryWriter) -> T + Send,
    ) -> T {
        if let Ok(mut w) = self.inner.try_lock() {
            return f(&mut w);
        }
        py.detach(|| f(&mut self.inner.lock().unwrap()))
    }

    /// Converts `values` (for `columns`) and appends them with `append`; returns None, or a
    /// tuple describing the rejected column (see `append`).
    fn append_with(
        &self,
        py: Python<'_>,
        columns: Vec<usize>,
        values: Vec<Bound<'_, PyAny>>,
        append: impl FnOnce(&mut TrajectoryWriter, Vec<(usize, Tensor)>) -> Result<(), AppendError>
            + Send,
    ) -> PyResult<Option<Py<PyTuple>>> {
        let tensors = values
            .iter()
            .map(|v| to_tensor(py, v))
            .collect::<PyResult<Vec<_>>>()?;
        let values: Vec<(usize, Tensor)> = columns.into_iter().zip(tensors).collect();
        match self.with(py, |w| append(w, values)) {
            Ok(()) => Ok(None),
            Err(e) => append_error(py, e),
        }
    }

    /// Repeats a bounded wait without the GIL until it reports done, letting Ctrl-C through.
    fn wait_until(
        &self,
        py: Python<'_>,
        deadline: Option<Instant>,
        what: &str,
        mut step: impl FnMut(&mut TrajectoryWriter, Option<Instant>) -> reverb_client::Result<bool>
            + Send,
    ) -> PyResult<()> {
        loop {
            let slice = Instant::now() + Duration::from_millis(100);
            let until = Some(deadline.map_or(slice, |d| d.min(slice)));
            let done = py
                .detach(|| step(&mut self.inner.lock().unwrap(), until))
                .map_err(client_err)?;
            if done {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(client_err(ClientError::deadline(format!(
                    "Timeout exceeded: {what} did not complete in time"
                ))));
            }
            py.check_signals()?;
        }
    }
}

#[pymethods]
impl PyTrajectoryWriter {
    #[new]
    #[pyo3(signature = (client, num_keep_alive_refs, max_chunk_length=None, max_in_flight_items=1024, delta_encode=false, reconnect_timeout=60.0, num_envs=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        client: &PyClient,
        num_keep_alive_refs: usize,
        max_chunk_length: Option<usize>,
        max_in_flight_items: usize,
        delta_encode: bool,
        reconnect_timeout: f64,
        num_envs: Option<usize>,
    ) -> PyResult<Self> {
        read_no_local(py);
        if !(reconnect_timeout.is_finite() && reconnect_timeout >= 0.0) {
            return Err(PyValueError::new_err(
                "reconnect_timeout must be a number of seconds >= 0",
            ));
        }
        let options = WriterOptions {
            num_keep_alive_refs,
            max_chunk_length,
            max_in_flight_items,
            delta_encode,
            reconnect_timeout: Duration::from_secs_f64(reconnect_timeout),
        };
        let client = client.inner.clone();
        let writer = match num_envs {
            None => TrajectoryWriter::new(client, options),
            Some(n) => TrajectoryWriter::with_lanes(client, options, n),
        }
        .map_err(client_err)?;
        Ok(Self {
            inner: Mutex::new(writer),
        })
    }

    /// Appends `values[i]` to column `columns[i]`. Returns None, or a tuple describing which
    /// column was rejected (`("already_set", col)` or `("mismatch", col, dtype, shape, dtype, shape)`).
    #[pyo3(signature = (columns, values, partial=false))]
    fn append(
        &self,
        py: Python<'_>,
        columns: Vec<usize>,
        values: Vec<Bound<'_, PyAny>>,
        partial: bool,
    ) -> PyResult<Option<Py<PyTuple>>> {
        self.append_with(py, columns, values, |w, v| w.append(v, partial))
    }

    /// Appends N full steps at once; every value has a leading dimension N.
    fn append_steps(
        &self,
        py: Python<'_>,
        columns: Vec<usize>,
        values: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyTuple>>> {
        self.append_with(py, columns, values, |w, v| w.append_steps(v).map(|_| ()))
    }

    /// Creates an item; `columns` is a list of `(refs, squeeze)` with refs `(column, step)`.
    fn create_item(
        &self,
        py: Python<'_>,
        table: String,
        priority: f64,
        columns: Vec<(Vec<(usize, u64)>, bool)>,
    ) -> PyResult<u64> {
        let columns: Vec<ItemColumn> = columns
            .into_iter()
            .map(|(refs, squeeze)| ItemColumn { refs, squeeze })
            .collect();
        let now = Some(Instant::now());
        let (key, sent) = self
            .with(py, |w| w.create_item(&table, priority, &columns, now))
            .map_err(client_err)?;
        if !sent {
            self.wait_until(py, None, "create_item", |w, until| w.send_ready(until))?;
        }
        Ok(key)
    }

    /// Sends everything queued and waits until at most `block_until_num_items` are unconfirmed.
    #[pyo3(signature = (block_until_num_items=0, timeout_ms=None))]
    fn flush(
        &self,
        py: Python<'_>,
        block_until_num_items: u64,
        timeout_ms: Option<i64>,
    ) -> PyResult<()> {
        let deadline = deadline(timeout_ms)?;
        self.wait_until(py, deadline, "flush", |w, until| {
            w.flush(block_until_num_items, until)
        })
    }

    /// Ends the episode (see `TrajectoryWriter::end_episode`).
    #[pyo3(signature = (clear_buffers=true, timeout_ms=None))]
    fn end_episode(
        &self,
        py: Python<'_>,
        clear_buffers: bool,
        timeout_ms: Option<i64>,
    ) -> PyResult<()> {
        let deadline = deadline(timeout_ms)?;
        self.wait_until(py, deadline, "end_episode", |w, until| {
            w.end_episode(clear_buffers, until)
        })
    }

    /// Whether the insert stream has failed for good.
    #[getter]
    fn failed(&self, py: Python<'_>) -> bool {
        self.with(py, |w| w.failed())
    }

    /// Stops at once, cancelling whatever the server has not stored yet.
    fn abort(&self, py: Python<'_>) {
        py.detach(|| self.inner.lock().unwrap().abort());
    }

    /// Stops the writer's stream.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.lock().unwrap().close());
    }

    /// Overrides keep-alive and chunk length of one column.
    fn configure(
        &self,
        py: Python<'_>,
        column: usize,
        num_keep_alive_refs: usize,
        max_chunk_length: Option<usize>,
    ) -> PyResult<()> {
        self.with(py, |w| {
            w.configure(column, num_keep_alive_refs, max_chunk_length)
        })
        .map_err(client_err)
    }

    /// Full steps appended in this episode.
    #[getter]
    fn episode_steps(&self, py: Python<'_>) -> u64 {
        self.with(py, |w| w.episode_steps())
    }

    /// Writer-wide index of the episode's first step (cells are addressed by writer-wide step).
    #[getter]
    fn episode_start(&self, py: Python<'_>) -> u64 {
        self.with(py, |w| w.episode_start())
    }

    /// Whether a partial step is open.
    #[getter]
    fn step_is_open(&self, py: Python<'_>) -> bool {
        self.with(py, |w| w.step_is_open())
    }

    /// `(dtype, shape)` of a column's rows, or None before its first value.
    fn column_spec(&self, py: Python<'_>, column: usize) -> Option<(i32, Vec<i64>)> {
        self.with(py, |w| w.column_spec(column))
    }

    /// Which steps of a column are still referenceable.
    fn alive(&self, py: Python<'_>, column: usize, steps: Vec<u64>) -> Vec<bool> {
        self.with(py, |w| w.alive(column, &steps))
    }

    /// The row of a cell as `(dtype, shape, uint8 array)`, or None when expired.
    fn read_cell<'py>(
        &self,
        py: Python<'py>,
        column: usize,
        step: u64,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        match self
            .with(py, |w| w.read_cell(column, step))
            .map_err(client_err)?
        {
            Some(t) => Ok(Some(column_out(py, t)?)),
            None => Ok(None),
        }
    }

    /// Items created and not yet confirmed.
    fn unconfirmed(&self, py: Python<'_>) -> u64 {
        self.with(py, |w| w.unconfirmed())
    }

    /// Vectorised writers: appends one step to every env; `values[i]` (field `fields[i]`)
    /// has a leading dimension of num_envs. Returns None or an error tuple as `append`
    /// (naming the field).
    fn append_lanes(
        &self,
        py: Python<'_>,
        fields: Vec<usize>,
        values: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyTuple>>> {
        self.append_with(py, fields, values, |w, v| w.append_lanes(v))
    }

    /// Vectorised writers: steps of each env's episode so far.
    fn lane_steps(&self, py: Python<'_>) -> Vec<u64> {
        self.with(py, |w| w.lane_steps())
    }

    /// Vectorised writers: writer-wide step of each env's first episode step.
    fn lane_starts(&self, py: Python<'_>) -> Vec<u64> {
        self.with(py, |w| w.lane_starts())
    }

    /// Vectorised writers: ends the episodes of `envs` (does not wait).
    fn end_lanes(&self, py: Python<'_>, envs: Vec<usize>, clear_buffers: bool) -> PyResult<()> {
        self.with(py, |w| w.end_lanes(&envs, clear_buffers))
            .map_err(client_err)
    }

    /// Vectorised writers: one item per env of `envs`; `columns` are `(field, steps,
    /// squeeze)` with steps an int, a `(start, stop, step)` tuple, or a list of ints.
    fn create_lane_items(
        &self,
        py: Python<'_>,
        table: String,
        priorities: Vec<f64>,
        envs: Vec<usize>,
        columns: Vec<(usize, Bound<'_, PyAny>, bool)>,
    ) -> PyResult<()> {
        let columns = columns
            .into_iter()
            .map(|(field, steps, squeeze)| {
                let steps = if let Ok(i) = steps.extract::<i64>() {
                    Steps::Index(i)
                } else if let Ok((a, b, c)) =
                    steps.extract::<(Option<i64>, Option<i64>, Option<i64>)>()
                {
                    Steps::Slice(a, b, c)
                } else {
                    Steps::List(steps.extract::<Vec<i64>>()?)
                };
                Ok((field, steps, squeeze))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let now = Some(Instant::now());
        let sent = self
            .with(py, |w| {
                w.create_lane_items(&table, &priorities, &envs, &columns, now)
            })
            .map_err(client_err)?;
        if !sent {
            self.wait_until(py, None, "create_item", |w, until| w.send_ready(until))?;
        }
        Ok(())
    }
}

/// Native half of `reverb.TrajectoryIterator`: a prefetching sampler.
#[pyclass(name = "Sampler", module = "reverb._native", frozen)]
struct PySampler {
    inner: Mutex<Option<Sampler>>,
}

#[pymethods]
impl PySampler {
    #[new]
    #[pyo3(signature = (client, table, max_in_flight_samples_per_worker, num_workers, max_samples, rate_limiter_timeout_ms))]
    fn new(
        py: Python<'_>,
        client: &PyClient,
        table: &str,
        max_in_flight_samples_per_worker: usize,
        num_workers: usize,
        max_samples: i64,
        rate_limiter_timeout_ms: i64,
    ) -> PyResult<Self> {
        let options = SamplerOptions {
            max_in_flight_samples_per_worker,
            num_workers,
            max_samples: (max_samples >= 0).then_some(max_samples as u64),
            rate_limiter_timeout: (rate_limiter_timeout_ms >= 0)
                .then(|| Duration::from_millis(rate_limiter_timeout_ms as u64)),
            local: {
                read_no_local(py);
                local_server(client.inner.address())
            },
            // Read with the GIL held, as `REVERB_NO_LOCAL` (see `read_no_local`).
            shared_memory: std::env::var_os("REVERB_NO_SHM").is_none_or(|v| v.is_empty()),
        };
        let sampler = {
            let _guard = runtime().enter();
            Sampler::new(client.inner.clone(), table, options).map_err(client_err)?
        };
        Ok(Self {
            inner: Mutex::new(Some(sampler)),
        })
    }

    /// The next `n` samples: `None` once the stream has ended; otherwise, stacked,
    /// `((keys, probabilities, table_sizes, priorities, times_sampled), [(dtype, shape, data)])`
    /// (fewer than `n` rows at the end), or unstacked a list like `Client.sample` returns.
    fn next<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        stacked: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let samples = loop {
            let got = py.detach(|| {
                let mut guard = self.inner.lock().unwrap();
                match guard.as_mut() {
                    None => Ok(Some(Vec::new())),
                    Some(sampler) => {
                        runtime().block_on(sampler.next(n, Duration::from_millis(100)))
                    }
                }
            });
            match got.map_err(client_err)? {
                Some(samples) => break samples,
                None => py.check_signals()?,
            }
        };
        if samples.is_empty() {
            return Ok(None);
        }
        // Decompressing the columns is the heavy part: without the GIL.
        if !stacked {
            let samples = py
                .detach(|| {
                    samples
                        .into_iter()
                        .map(|s| s.assemble())
                        .collect::<reverb_client::Result<Vec<_>>>()
                })
                .map_err(client_err)?;
            return Ok(Some(samples_out(py, samples)?.into_any()));
        }
        let batch = py.detach(|| stack(samples)).map_err(client_err)?;
        let info = PyTuple::new(
            py,
            [
                PyArray1::from_vec(py, batch.info.iter().map(|i| i.0).collect()).into_any(),
                PyArray1::from_vec(py, batch.info.iter().map(|i| i.1).collect()).into_any(),
                PyArray1::from_vec(py, batch.info.iter().map(|i| i.2).collect()).into_any(),
                PyArray1::from_vec(py, batch.info.iter().map(|i| i.3).collect()).into_any(),
                PyArray1::from_vec(py, batch.info.iter().map(|i| i.4).collect()).into_any(),
            ],
        )?;
        let columns = batch
            .columns
            .into_iter()
            .map(|t| column_out(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Some(
            PyTuple::new(py, [info.into_any(), PyList::new(py, columns)?.into_any()])?.into_any(),
        ))
    }

    /// Stops the workers.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.lock().unwrap().take());
    }
}

/// Serialized `FileDescriptorSet` of the wire protocol (for Python message classes).
#[pyfunction]
fn descriptor_set<'py>(py: Python<'py>) -> Bound<'py, PyBytes> {
    PyBytes::new(py, reverb_proto::FILE_DESCRIPTOR_SET)
}

/// `REVERB_NO_LOCAL` as last read: forces gRPC even to servers of this process (tests cover
/// both paths). Read from the environment only by calls from Python (holding the GIL, as
/// Python's own `os.environ` writes do), never from runtime threads, where reading it could
/// race with a `putenv`.
static NO_LOCAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Refreshes [`NO_LOCAL`] from the environment (call with the GIL held).
fn read_no_local(_py: Python<'_>) {
    let set = std::env::var_os("REVERB_NO_LOCAL").is_some_and(|v| !v.is_empty());
    NO_LOCAL.store(set, std::sync::atomic::Ordering::Relaxed);
}

/// A server of this process that `address` names, reached without gRPC (unless
/// `REVERB_NO_LOCAL` was set when the calling client, writer or sampler was made).
fn local_server(address: &str) -> Option<Local> {
    if NO_LOCAL.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let port = loopback_port(address).filter(|&p| reverb_server::local::is_local(p))?;
    Some(Local {
        sample: reverb_inproc_sample_v2,
        port,
    })
}

/// The port of `address` when it names a server running in this process, else `None`: the
/// TensorFlow kernels then sample it through `reverb_inproc_sample_v2`.
#[pyfunction]
fn local_port(py: Python<'_>, address: &str) -> Option<u16> {
    read_no_local(py);
    local_server(address).map(|l| l.port)
}

/// Chunks this library's samplers received through shared memory (tests check the path).
#[pyfunction]
fn _shm_chunks_received() -> u64 {
    reverb_client::shm::chunks_received()
}

/// Releases a chunk lent by `reverb_inproc_sample_v2`.
///
/// # Safety
/// `owner` comes from `Arc::into_raw` on an `Arc<Chunk>`, and is released exactly once.
unsafe extern "C" fn release_chunk(owner: *const std::ffi::c_void) {
    // SAFETY: see above.
    drop(unsafe { Arc::from_raw(owner as *const reverb_core::Chunk) });
}

/// In-process sampling for clients built into other libraries (the TensorFlow kernels), which
/// find this function with `dlsym`: up to `max_items` samples of `table` from this process's
/// server on `port`, waiting at most `wait_ms` for the first, handed to `emit` piece by piece
/// (see `reverb_client::local`), chunk bytes lent rather than copied. Returns a status code
/// (0: OK).
///
/// # Safety
/// `table` must point at `table_len` readable bytes; `sink` is passed back to `emit` as is.
#[no_mangle]
pub unsafe extern "C" fn reverb_inproc_sample_v2(
    port: u16,
    table: *const u8,
    table_len: usize,
    max_items: usize,
    wait_ms: u64,
    sink: *mut std::ffi::c_void,
    emit: EmitFn,
) -> i32 {
    use reverb_client::local::{SharedData, CHUNK, ERROR, INFO, SHARED_DATA};
    // SAFETY: the caller passes `table_len` readable bytes at `table`.
    let name = unsafe { std::slice::from_raw_parts(table, table_len) };
    let result = std::panic::catch_unwind(|| {
        let name = std::str::from_utf8(name)
            .map_err(|_| tonic::Status::invalid_argument("table name is not UTF-8"))?;
        reverb_server::local::sample(port, name, max_items, Duration::from_millis(wait_ms))
    });
    let send = |kind: u32, bytes: &[u8]| {
        // SAFETY: `emit` and `sink` come from the caller, which reads `bytes` only during
        // the call.
        unsafe { emit(sink, kind, bytes.as_ptr(), bytes.len()) }
    };
    match result {
        Ok(Ok(items)) => {
            for s in items {
                send(INFO, &s.info().encode_to_vec());
                for chunk in &s.item.chunks {
                    let data = chunk.data();
                    let header = reverb_proto::ChunkData {
                        data: Default::default(),
                        ..data.clone()
                    };
                    send(CHUNK, &header.encode_to_vec());
                    // The bytes are lent, not copied: the receiver holds a reference on the
                    // chunk until it is done with them.
                    let lent = SharedData {
                        data: data.data.as_ptr(),
                        len: data.data.len(),
                        owner: Arc::into_raw(chunk.clone()) as *const std::ffi::c_void,
                        release: release_chunk,
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

/// A writer's insert stream to a server of this process (see `reverb_client::local`).
struct LocalInsert(reverb_server::local::LocalInsert);

impl reverb_client::local::LocalInsert for LocalInsert {
    fn insert(
        &mut self,
        request: reverb_proto::InsertStreamRequest,
    ) -> futures::future::BoxFuture<'_, Result<Vec<u64>, tonic::Status>> {
        Box::pin(self.0.insert(request))
    }
}

/// Opens an insert stream without gRPC when `address` names a server of this process.
fn open_local_insert(address: &str) -> Option<Box<dyn reverb_client::local::LocalInsert>> {
    let local = local_server(address)?;
    let insert = reverb_server::local::LocalInsert::open(local.port)?;
    Some(Box::new(LocalInsert(insert)))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTable>()?;
    m.add_class::<PyServer>()?;
    m.add_class::<PyClient>()?;
    m.add_class::<PyTrajectoryWriter>()?;
    m.add_class::<PySampler>()?;
    m.add_function(wrap_pyfunction!(descriptor_set, m)?)?;
    m.add_function(wrap_pyfunction!(local_port, m)?)?;
    m.add_function(wrap_pyfunction!(_shm_chunks_received, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    reverb_client::local::set_local_insert(open_local_insert);
    Ok(())
}
