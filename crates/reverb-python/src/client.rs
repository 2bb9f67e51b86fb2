//! `reverb._native.Client`: unary calls and `Client.sample` (over gRPC, or straight to a
//! server of this process: `reverb_client` decides per call).

use crate::blocking::{deadline_ms, lock_with_gil, on_views, run, run_for, seconds, slices};
use crate::errors::{client_error, IntoPyResult};
use crate::numpy::{column_out, to_array};
use crate::table_info::PyTableInfo;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyList;
use reverb_client::sampler::sample_shards as sample_shards_of;
use reverb_client::tensor::TensorView;
use reverb_client::transport::tls::Tls;
use reverb_client::writer::runs::run_requests;
use reverb_client::writer::Inserter;
use reverb_client::{Client, ClientError, Sample};
use std::sync::Mutex;
use std::time::Instant;

/// A client call's future, owning what it needs.
type BoxFuture<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = reverb_client::Result<T>> + Send>>;

/// Whether calls may skip gRPC for servers of this process: unless `REVERB_NO_INPROC` is set
/// (tests cover both paths). Read when clients, writers and samplers are made, with the GIL
/// held (as Python's own `os.environ` writes are), never from runtime threads, where reading
/// the environment could race with a `putenv`.
pub(crate) fn inproc_allowed(_py: Python<'_>) -> bool {
    // (`REVERB_NO_LOCAL` is its earlier name.)
    ["REVERB_NO_INPROC", "REVERB_NO_LOCAL"]
        .iter()
        .all(|name| std::env::var_os(name).is_none_or(|v| v.is_empty()))
}

/// A client of one server address.
#[pyclass(name = "Client", module = "reverb._native", frozen)]
pub(crate) struct PyClient {
    pub(crate) inner: Client,
    /// `Client.insert`'s writer, kept between inserts; held for a whole insert (inserts from
    /// several threads take turns).
    inserter: Mutex<Inserter>,
}

impl PyClient {
    /// An insert: `start` queues it (on the leaves of `values`), then the wait for the server
    /// to store it runs in GIL-free slices that check for signals; a timeout or a signal
    /// aborts it, and an insert on a stream that died since the last one is tried once more.
    fn insert_with(
        &self,
        py: Python<'_>,
        values: Vec<Bound<'_, PyAny>>,
        timeout_ms: Option<i64>,
        start: impl for<'a> Fn(&mut Inserter, &[TensorView<'a>]) -> reverb_client::Result<Vec<u64>>,
    ) -> PyResult<()> {
        let deadline = deadline_ms(timeout_ms)?;
        let arrays = values
            .iter()
            .map(|v| to_array(py, v))
            .collect::<PyResult<Vec<_>>>()?;
        // Held for the whole insert (inserts in flight at once would share, and abort, one
        // another's stream: see `Inserter`).
        let mut inserter = lock_with_gil(py, &self.inserter);
        let inserter = &mut *inserter;
        loop {
            let started = on_views(py, inserter, &arrays, |i, views| start(i, views));
            let inserted = match started {
                Err(e) => Err(e),
                Ok(_) => {
                    let waited = slices(py, deadline, |until| match inserter.wait(Some(until)) {
                        Ok(false) => None,
                        done => Some(done),
                    });
                    match waited {
                        Ok(Some(done)) => done.map(|_| ()),
                        Ok(None) => {
                            inserter.abort();
                            Err(ClientError::deadline(
                                "Timeout exceeded: insert did not complete in time",
                            ))
                        }
                        // (A signal, e.g. KeyboardInterrupt.)
                        Err(e) => {
                            inserter.abort();
                            return Err(e);
                        }
                    }
                }
            };
            match inserted {
                Ok(()) => return Ok(()),
                Err(e) if inserter.retry_after(&e) => {}
                Err(e) => return Err(client_error(e)),
            }
        }
    }

    /// Runs a call of the client: on this thread when it reaches a server of this process,
    /// else on the client runtime (see `blocking`).
    fn call<T: Send + 'static>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(Client) -> BoxFuture<T>,
    ) -> PyResult<T> {
        run_for(py, &self.inner, f(self.inner.clone()))
    }

    /// The client, with in-process calls allowed as the environment says now.
    pub(crate) fn fresh(&self, py: Python<'_>) -> Client {
        self.inner.clone().with_inproc(inproc_allowed(py))
    }
}

/// Asks every client's server for its tables at once (the shards of a `ShardedClient`),
/// client `i` with timeout `timeouts[i]` (seconds; None or 0: none): per client, a list of
/// `TableInfo`s, or the exception its call raised.
#[pyfunction]
pub(crate) fn server_info_all<'py>(
    py: Python<'py>,
    clients: Vec<PyRef<'py, PyClient>>,
    timeouts: Vec<Option<f64>>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if timeouts.len() != clients.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "server_info_all needs one timeout per client",
        ));
    }
    let timeouts = timeouts
        .into_iter()
        .map(seconds)
        .collect::<PyResult<Vec<_>>>()?;
    let clients: Vec<Client> = clients.iter().map(|c| c.fresh(py)).collect();
    let answers = run(py, async move {
        let calls = clients
            .iter()
            .zip(timeouts)
            .map(|(c, timeout)| c.server_info(timeout));
        Ok(futures::future::join_all(calls).await)
    })?;
    answers
        .into_iter()
        .map(|answer| match answer {
            Ok(infos) => {
                let infos = infos
                    .into_iter()
                    .map(|i| Bound::new(py, PyTableInfo::new(i)))
                    .collect::<PyResult<Vec<_>>>()?;
                Ok(PyList::new(py, infos)?.into_any())
            }
            Err(e) => Ok(client_error(e).into_value(py).into_bound(py).into_any()),
        })
        .collect()
}

/// What [`sample_shards`] returns to Python: samples, their shards, the error, the missing
/// shards.
type ShardSamplesOut<'py> = (
    Bound<'py, PyList>,
    Vec<usize>,
    Bound<'py, PyAny>,
    Vec<usize>,
);

/// `ShardedClient.sample`: samples `table` over the shards `clients` used as one (see
/// `reverb_client::sampler::sample_shards`); `missing` lists the shards that did not answer
/// last time. Returns `(samples, shards, error, missing)`: samples as `Client.sample`'s (with
/// global probabilities and table sizes), the shard of each, the exception that stopped the
/// call part-way (or None), and the shards that did not answer now.
#[pyfunction]
#[pyo3(signature = (clients, missing, table, num_samples, timeout=None))]
pub(crate) fn sample_shards<'py>(
    py: Python<'py>,
    clients: Vec<PyRef<'py, PyClient>>,
    missing: Vec<usize>,
    table: String,
    num_samples: usize,
    timeout: Option<f64>,
) -> PyResult<ShardSamplesOut<'py>> {
    if clients.is_empty() {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "sample_shards needs at least one client",
        ));
    }
    let timeout = seconds(timeout)?;
    let clients: Vec<Client> = clients.iter().map(|c| c.fresh(py)).collect();
    let mut flags = vec![false; clients.len()];
    for i in missing {
        if let Some(flag) = flags.get_mut(i) {
            *flag = true;
        }
    }
    let (out, flags) = run(py, async move {
        let out = sample_shards_of(&clients, &mut flags, &table, num_samples, timeout).await?;
        Ok((out, flags))
    })?;
    let failure = match out.failure {
        Some(e) => client_error(e).into_value(py).into_bound(py).into_any(),
        None => py.None().into_bound(py),
    };
    let missing = flags
        .iter()
        .enumerate()
        .filter_map(|(i, &m)| m.then_some(i))
        .collect();
    Ok((samples_out(py, out.samples)?, out.shards, failure, missing))
}

/// The shard an item key written through a `ShardedClient` names (None for other keys).
#[pyfunction]
pub(crate) fn key_shard(key: u64) -> Option<u8> {
    reverb_client::shards::key_shard(key)
}

/// How long, in seconds, a call without a timeout waits for a server that cannot be reached
/// (`REVERB_CONNECT_WAIT_SECONDS`, else 60).
#[pyfunction]
pub(crate) fn connect_wait_seconds(_py: Python<'_>) -> f64 {
    reverb_client::connect_wait().as_secs_f64()
}

/// The fields of `SampleInfo`, in the order [`sample_info`] passes them.
const SAMPLE_INFO_FIELDS: [&str; 5] = [
    "key",
    "probability",
    "table_size",
    "priority",
    "times_sampled",
];

/// `reverb.replay_sample.SampleInfo`, imported once; its fields are checked to be in the
/// order [`sample_info`] passes them.
fn sample_info_class(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static CLASS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let class = CLASS.get_or_try_init(py, || {
        let class = py.import("reverb.replay_sample")?.getattr("SampleInfo")?;
        let fields: Vec<String> = class.getattr("_fields")?.extract()?;
        if fields != SAMPLE_INFO_FIELDS {
            return Err(PyRuntimeError::new_err(format!(
                "reverb.replay_sample.SampleInfo has unexpected fields {fields:?}"
            )));
        }
        Ok(class.unbind())
    })?;
    Ok(class.bind(py))
}

/// A `reverb.replay_sample.SampleInfo` of values (one sample) or of arrays (a batch).
pub(crate) fn sample_info<'py, K, P, S, Q, T>(
    py: Python<'py>,
    key: K,
    probability: P,
    table_size: S,
    priority: Q,
    times_sampled: T,
) -> PyResult<Bound<'py, PyAny>>
where
    (K, P, S, Q, T): pyo3::call::PyCallArgs<'py>,
{
    sample_info_class(py)?.call1((key, probability, table_size, priority, times_sampled))
}

/// Samples as Python sees them: a list of `(SampleInfo, [(dtype, shape, data)])`.
pub(crate) fn samples_out(py: Python<'_>, samples: Vec<Sample>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for s in samples {
        let item = s.info.item.unwrap_or_default();
        let info = sample_info(
            py,
            item.key,
            s.info.probability,
            s.info.table_size,
            item.priority,
            item.times_sampled,
        )?;
        let columns = s
            .columns
            .into_iter()
            .map(|t| column_out(py, t))
            .collect::<PyResult<Vec<_>>>()?;
        out.append((info, PyList::new(py, columns)?))?;
    }
    Ok(out)
}

/// `p` unless it is empty (Python passes "" for "not given" too).
fn nonempty(p: Option<&str>) -> Option<&str> {
    p.filter(|p| !p.is_empty())
}

#[pymethods]
impl PyClient {
    /// A client of `address`, sending `auth_token` with every call (by default
    /// `REVERB_AUTH_TOKEN`'s value, if any); over TLS trusting the authority `tls_ca`
    /// (presenting `tls_cert`/`tls_key` when given), by default as `REVERB_TLS_*` say.
    #[new]
    /// With `key_shard`, the keys of items written through it name that shard (a client of
    /// one shard of a `ShardedClient`).
    #[pyo3(signature = (address, auth_token=None, tls_ca=None, tls_cert=None, tls_key=None, key_shard=None))]
    fn new(
        py: Python<'_>,
        address: &str,
        auth_token: Option<&str>,
        tls_ca: Option<&str>,
        tls_cert: Option<&str>,
        tls_key: Option<&str>,
        key_shard: Option<usize>,
    ) -> PyResult<Self> {
        let mut inner = Client::new(address).py()?.with_key_shard(key_shard).py()?;
        let auth_token = auth_token.filter(|t| !t.is_empty());
        if auth_token.is_some() {
            inner = inner.with_auth_token(auth_token).py()?;
        }
        let (ca, cert, key) = (nonempty(tls_ca), nonempty(tls_cert), nonempty(tls_key));
        if ca.is_some() || cert.is_some() || key.is_some() {
            let server_name = reverb_proto::tls::env_path(reverb_proto::tls::ENV_SERVER_NAME);
            let tls = Tls::from_paths(ca, cert, key, server_name.as_deref())
                .map_err(pyo3::exceptions::PyValueError::new_err)?;
            inner = inner.with_tls(tls).py()?;
        }
        let inner = inner.with_inproc(inproc_allowed(py));
        Ok(Self {
            inserter: Mutex::new(Inserter::new(inner.clone())),
            inner,
        })
    }

    /// The server address.
    #[getter]
    fn address(&self) -> &str {
        self.inner.address()
    }

    /// Every table's `TableInfo`.
    #[pyo3(signature = (timeout=None))]
    fn server_info(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Vec<PyTableInfo>> {
        let timeout = seconds(timeout)?;
        let infos = self.call(py, |c| {
            Box::pin(async move { c.server_info(timeout).await })
        })?;
        Ok(infos.into_iter().map(PyTableInfo::new).collect())
    }

    /// Deletes `deletes` then sets the priorities of `keys` (uint64 and float64 bytes in
    /// native order, as many of each: no Python object per update).
    #[pyo3(signature = (table, keys, priorities, deletes, timeout=None))]
    fn mutate_priorities(
        &self,
        py: Python<'_>,
        table: String,
        keys: &[u8],
        priorities: &[u8],
        deletes: Vec<u64>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        if !keys.len().is_multiple_of(8) || keys.len() != priorities.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "mutate_priorities needs as many uint64 keys as float64 priorities, as bytes",
            ));
        }
        let updates: Vec<(u64, f64)> = keys
            .chunks_exact(8)
            .zip(priorities.chunks_exact(8))
            .map(|(k, p)| {
                let k = u64::from_ne_bytes(k.try_into().expect("8 bytes"));
                (k, f64::from_ne_bytes(p.try_into().expect("8 bytes")))
            })
            .collect();
        let timeout = seconds(timeout)?;
        self.call(py, |c| {
            Box::pin(async move { c.mutate_priorities(&table, updates, deletes, timeout).await })
        })
    }

    /// Empties a table.
    #[pyo3(signature = (table, timeout=None))]
    fn reset(&self, py: Python<'_>, table: String, timeout: Option<f64>) -> PyResult<()> {
        let timeout = seconds(timeout)?;
        self.call(py, |c| {
            Box::pin(async move { c.reset(&table, timeout).await })
        })
    }

    /// Inserts one step (`values`: its leaves) as one item per `(table, priority)`, the items
    /// sharing the step's chunks; returns once the server stored them (DeadlineExceededError
    /// after `timeout_ms`). A failed, timed-out or interrupted insert is never stored later.
    #[pyo3(signature = (values, priorities, timeout_ms=None))]
    fn insert(
        &self,
        py: Python<'_>,
        values: Vec<Bound<'_, PyAny>>,
        priorities: Vec<(String, f64)>,
        timeout_ms: Option<i64>,
    ) -> PyResult<()> {
        self.insert_with(py, values, timeout_ms, |i, step| i.start(step, &priorities))
    }

    /// Inserts N steps (`values`: leaves with a leading dimension N) as N items per
    /// `(table, priorities)` (N float64 priorities each, as bytes in native order), item `i`
    /// holding step `i`, all in one episode's chunks; returns as `insert` does.
    #[pyo3(signature = (values, priorities, timeout_ms=None))]
    fn insert_steps(
        &self,
        py: Python<'_>,
        values: Vec<Bound<'_, PyAny>>,
        priorities: Vec<(String, Bound<'_, pyo3::types::PyBytes>)>,
        timeout_ms: Option<i64>,
    ) -> PyResult<()> {
        let priorities = float64_priorities(priorities)?;
        let deadline = deadline_ms(timeout_ms)?;
        let left = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
        let timeout = left();
        let takes_runs = self.call(py, move |c| {
            Box::pin(async move { c.takes_item_runs(timeout).await })
        })?;
        if !takes_runs {
            // (A server that knows only the reference's protocol: items one by one, within
            // what is left of the timeout.)
            let left_ms = left().map(|d| d.as_millis().min(i64::MAX as u128) as i64);
            return self.insert_with(py, values, left_ms, |i, steps| {
                i.start_steps(steps, &priorities)
            });
        }
        let requests = step_requests(py, &self.inner, &values, &priorities)?;
        let timeout = left();
        self.call(py, move |c| {
            Box::pin(async move { c.insert_requests(requests, timeout).await })
        })
    }

    /// Asks the server to checkpoint; returns the path.
    #[pyo3(signature = (timeout=None))]
    fn checkpoint(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<String> {
        let timeout = seconds(timeout)?;
        self.call(py, |c| Box::pin(async move { c.checkpoint(timeout).await }))
    }

    /// Samples `num_samples` items. Returns `(samples, error)`: a list of
    /// `(SampleInfo, [(dtype, shape, data)])` and the exception that stopped the call part-way
    /// (or None).
    #[pyo3(signature = (table, num_samples, rate_limiter_timeout=None, timeout=None))]
    fn sample<'py>(
        &self,
        py: Python<'py>,
        table: String,
        num_samples: usize,
        rate_limiter_timeout: Option<f64>,
        timeout: Option<f64>,
    ) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyAny>)> {
        let timeout = seconds(timeout)?;
        let rl_timeout = seconds(rate_limiter_timeout)?;
        let (samples, failure) = self.call(py, |c| {
            Box::pin(async move {
                c.sample_partial(&table, num_samples, rl_timeout, timeout)
                    .await
            })
        })?;
        let out = samples_out(py, samples)?;
        let failure = match failure {
            Some(e) => client_error(e).into_value(py).into_bound(py).into_any(),
            None => py.None().into_bound(py),
        };
        Ok((out, failure))
    }
}

/// Priorities of `insert_steps` as `(table, float64 bytes in native order)` (no Python float
/// per step), read.
pub(crate) fn float64_priorities(
    priorities: Vec<(String, Bound<'_, pyo3::types::PyBytes>)>,
) -> PyResult<Vec<(String, Vec<f64>)>> {
    priorities
        .into_iter()
        .map(|(table, bytes)| {
            let bytes = bytes.as_bytes();
            if bytes.len() % 8 != 0 {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "the priorities of table '{table}' are not float64 bytes"
                )));
            }
            let values = bytes
                .chunks_exact(8)
                .map(|b| f64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .collect();
            Ok((table, values))
        })
        .collect()
}

/// The requests inserting the steps of `values` (leaves with a leading dimension N) as N
/// items per table in item runs (see `run_requests`).
pub(crate) fn step_requests(
    py: Python<'_>,
    client: &Client,
    values: &[Bound<'_, PyAny>],
    priorities: &[(String, Vec<f64>)],
) -> PyResult<Vec<reverb_proto::InsertStreamRequest>> {
    let arrays = values
        .iter()
        .map(|v| to_array(py, v))
        .collect::<PyResult<Vec<_>>>()?;
    let limit = Some(client.max_message_size());
    on_views(py, &mut (), &arrays, |_, steps| {
        run_requests(client, steps, priorities, limit)
    })
    .map_err(client_error)
}
