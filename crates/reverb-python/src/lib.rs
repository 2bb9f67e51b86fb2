//! `reverb._native`: the Python face of the engine, server and client.
//!
//! Python never sees gRPC: it hands numpy buffers in and gets numpy buffers back. Every
//! blocking call releases the GIL and wakes every 100 ms to let Ctrl-C through.

use numpy::{PyArray1, PyReadonlyArray1};
use prost::Message;
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use reverb_client::{runtime, Client, ClientError, Tensor};
use reverb_core::{CoreError, RateLimiterConfig, SelectorKind, Table, TableConfig};
use reverb_server::{Server, ServerOptions};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
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
        Some(t) if t == 0.0 => Ok(None),
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
    #[pyo3(signature = (tables, port=0))]
    fn new(py: Python<'_>, tables: Vec<PyRef<'_, PyTable>>, port: u16) -> PyResult<Self> {
        let tables: Vec<Arc<Table>> = tables.iter().map(|t| t.inner.clone()).collect();
        let options = ServerOptions {
            port,
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

type Column<'py> = (i32, Vec<i64>, PyReadonlyArray1<'py, u8>);

fn tensor(column: Column<'_>) -> PyResult<Tensor> {
    let (dtype, shape, data) = column;
    let bytes = data
        .as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))?
        .to_vec();
    Tensor::new(dtype, shape, bytes).map_err(|e| PyValueError::new_err(e.message))
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

#[pymethods]
impl PyClient {
    #[new]
    fn new(address: &str) -> PyResult<Self> {
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
        wait(py, async move {
            c.mutate_priorities(&table, updates, deletes, timeout).await
        })
    }

    /// Empties a table.
    #[pyo3(signature = (table, timeout=None))]
    fn reset(&self, py: Python<'_>, table: String, timeout: Option<f64>) -> PyResult<()> {
        let c = self.inner.clone();
        let timeout = seconds(timeout)?;
        wait(py, async move { c.reset(&table, timeout).await })
    }

    /// Asks the server to checkpoint; returns the path.
    #[pyo3(signature = (timeout=None))]
    fn checkpoint(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<String> {
        let c = self.inner.clone();
        let timeout = seconds(timeout)?;
        wait(py, async move { c.checkpoint(timeout).await })
    }

    /// Inserts one step as one item per `(table, priority)`; returns the item keys.
    /// Each column is `(tf dtype, shape, flat uint8 view of the data)`.
    #[pyo3(signature = (columns, priorities, timeout=None))]
    fn insert(
        &self,
        py: Python<'_>,
        columns: Vec<Column<'_>>,
        priorities: Vec<(String, f64)>,
        timeout: Option<f64>,
    ) -> PyResult<Vec<u64>> {
        let columns = columns
            .into_iter()
            .map(tensor)
            .collect::<PyResult<Vec<_>>>()?;
        let c = self.inner.clone();
        let timeout = seconds(timeout)?;
        wait(py, async move {
            c.insert_step(columns, priorities, timeout).await
        })
    }

    /// Samples `num_samples` items. Returns a list of
    /// `((key, probability, table_size, priority, times_sampled), [(dtype, shape, bytes)])`.
    #[pyo3(signature = (table, num_samples, rate_limiter_timeout=None, timeout=None))]
    fn sample<'py>(
        &self,
        py: Python<'py>,
        table: String,
        num_samples: usize,
        rate_limiter_timeout: Option<f64>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let c = self.inner.clone();
        let timeout = seconds(timeout)?;
        let rl_timeout = seconds(rate_limiter_timeout)?;
        let samples = wait(py, async move {
            c.sample(&table, num_samples, rl_timeout, timeout).await
        })?;
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
}

/// Serialized `FileDescriptorSet` of the wire protocol (for Python message classes).
#[pyfunction]
fn descriptor_set<'py>(py: Python<'py>) -> Bound<'py, PyBytes> {
    PyBytes::new(py, reverb_proto::FILE_DESCRIPTOR_SET)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTable>()?;
    m.add_class::<PyServer>()?;
    m.add_class::<PyClient>()?;
    m.add_function(wrap_pyfunction!(descriptor_set, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
