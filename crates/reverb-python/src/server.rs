//! `reverb._native.Table` and `reverb._native.Server`: the engine's tables (with their
//! `Selector`s and `RateLimiter`) and a server serving them.

use crate::blocking::{seconds, slices};
use crate::errors::start_error;
use prost::Message;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use reverb_core::{CoreError, RateLimiterConfig, SelectorKind, Table, TableConfig};
use reverb_server::{Checkpointer, Server, ServerOptions, ServerTls, StorageOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn core_err(e: CoreError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// An item selector (what `reverb.item_selectors` hands a table).
#[pyclass(name = "Selector", module = "reverb._native", frozen)]
pub(crate) struct PySelector(SelectorKind);

#[pymethods]
impl PySelector {
    /// Every item with equal probability.
    #[staticmethod]
    fn uniform() -> Self {
        Self(SelectorKind::Uniform)
    }

    /// Probability proportional to `priority ** priority_exponent`.
    #[staticmethod]
    #[pyo3(signature = (*, priority_exponent))]
    fn prioritized(priority_exponent: f64) -> Self {
        Self(SelectorKind::Prioritized { priority_exponent })
    }

    /// The oldest item.
    #[staticmethod]
    fn fifo() -> Self {
        Self(SelectorKind::Fifo)
    }

    /// The newest item.
    #[staticmethod]
    fn lifo() -> Self {
        Self(SelectorKind::Lifo)
    }

    /// The lowest priority (ties: least recently inserted or updated).
    #[staticmethod]
    fn min_heap() -> Self {
        Self(SelectorKind::MinHeap)
    }

    /// The highest priority (ties: least recently inserted or updated).
    #[staticmethod]
    fn max_heap() -> Self {
        Self(SelectorKind::MaxHeap)
    }

    fn __repr__(&self) -> String {
        format!("Selector({:?})", self.0)
    }
}

/// A rate limiter's bounds (what `reverb.rate_limiters` hands a table).
#[pyclass(name = "RateLimiter", module = "reverb._native", frozen)]
pub(crate) struct PyRateLimiter(RateLimiterConfig);

#[pymethods]
impl PyRateLimiter {
    #[new]
    #[pyo3(signature = (*, samples_per_insert, min_size_to_sample, min_diff, max_diff))]
    fn new(samples_per_insert: f64, min_size_to_sample: i64, min_diff: f64, max_diff: f64) -> Self {
        Self(RateLimiterConfig {
            samples_per_insert,
            min_size_to_sample,
            min_diff,
            max_diff,
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.0)
    }
}

/// A replay table (the engine's), usable before and while a server serves it.
#[pyclass(name = "Table", module = "reverb._native", frozen)]
pub(crate) struct PyTable {
    inner: Arc<Table>,
}

#[pymethods]
impl PyTable {
    #[new]
    #[pyo3(signature = (*, name, sampler, remover, max_size, max_times_sampled, rate_limiter, signature=None))]
    fn new(
        name: String,
        sampler: PyRef<'_, PySelector>,
        remover: PyRef<'_, PySelector>,
        max_size: i64,
        max_times_sampled: i32,
        rate_limiter: PyRef<'_, PyRateLimiter>,
        signature: Option<Vec<u8>>,
    ) -> PyResult<Self> {
        let config = TableConfig {
            name,
            sampler: sampler.0,
            remover: remover.0,
            max_size,
            max_times_sampled,
            rate_limiter: rate_limiter.0,
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
pub(crate) struct PyServer {
    inner: Server,
}

#[pymethods]
impl PyServer {
    #[new]
    /// Restores the latest checkpoint under `checkpoint_root` (or `fallback_checkpoint_path`)
    /// before serving; `Checkpoint` calls save there, keeping `keep_latest`.
    /// Listens on `host` (every interface when `None`); with `auth_token` (by default
    /// `REVERB_AUTH_TOKEN`'s value, if any) serves only calls that carry it. Serves TLS with
    /// the certificate `tls_cert` and key `tls_key` (PEM files; with `tls_client_ca`, only to
    /// clients presenting a certificate it signed), by default as `REVERB_TLS_*` say. With
    /// `storage_dir`, chunk payloads are kept on disk there behind a cache of `cache_bytes`.
    #[pyo3(signature = (tables, *, port=0, checkpoint_root=None, fallback_checkpoint_path=None, keep_latest=1, host=None, auth_token=None, metrics_port=None, log_stats_every=None, tls_cert=None, tls_key=None, tls_client_ca=None, storage_dir=None, cache_bytes=1073741824, sync_interval=1.0, sync_always=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        tables: Vec<PyRef<'_, PyTable>>,
        port: u16,
        checkpoint_root: Option<std::path::PathBuf>,
        fallback_checkpoint_path: Option<std::path::PathBuf>,
        keep_latest: usize,
        host: Option<String>,
        auth_token: Option<String>,
        metrics_port: Option<u16>,
        log_stats_every: Option<f64>,
        tls_cert: Option<String>,
        tls_key: Option<String>,
        tls_client_ca: Option<String>,
        storage_dir: Option<std::path::PathBuf>,
        cache_bytes: usize,
        sync_interval: f64,
        sync_always: bool,
    ) -> PyResult<Self> {
        let given = |p: Option<String>| p.filter(|p| !p.is_empty());
        let (cert, key, ca) = (given(tls_cert), given(tls_key), given(tls_client_ca));
        let tls = if cert.is_none() && key.is_none() && ca.is_none() {
            ServerTls::from_env()
        } else {
            ServerTls::from_paths(cert.as_deref(), key.as_deref(), ca.as_deref())
        }
        .map_err(pyo3::exceptions::PyValueError::new_err)?;
        let log_stats_every = match log_stats_every {
            None => None,
            Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
            Some(s) => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "log_stats_every must be a positive number of seconds, got {s}"
                )))
            }
        };
        let tables: Vec<Arc<Table>> = tables.iter().map(|t| t.inner.clone()).collect();
        let checkpointer = checkpoint_root.map(|root| {
            Arc::new(Checkpointer::new(
                root,
                fallback_checkpoint_path,
                keep_latest,
            ))
        });
        if !(sync_interval.is_finite() && sync_interval > 0.0) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "sync_interval must be a positive number of seconds, got {sync_interval}"
            )));
        }
        let storage = storage_dir.map(|dir| StorageOptions {
            dir,
            cache_bytes,
            sync_interval: Duration::from_secs_f64(sync_interval),
            sync_always,
        });
        let defaults = ServerOptions::default();
        let options = ServerOptions {
            storage,
            port,
            host,
            auth_token: auth_token
                .filter(|t| !t.is_empty())
                .or(defaults.auth_token.clone()),
            tls,
            checkpointer,
            metrics_port,
            log_stats_every,
            ..defaults
        };
        let inner = py
            .detach(|| Server::start(tables, options))
            .map_err(start_error)?;
        Ok(Self { inner })
    }

    /// The port being served.
    #[getter]
    fn port(&self) -> u16 {
        self.inner.port()
    }

    /// The port metrics are served on, if any.
    #[getter]
    fn metrics_port(&self) -> Option<u16> {
        self.inner.metrics_port()
    }

    /// Stops the server (open streams end with an error on the client side).
    fn stop(&self, py: Python<'_>) {
        py.detach(|| self.inner.stop());
    }

    /// Blocks until the server stops, or `timeout` seconds pass; returns whether it stopped.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = seconds(timeout)?.map(|t| Instant::now() + t);
        let stopped = slices(py, deadline, |until| {
            let left = until.saturating_duration_since(Instant::now());
            self.inner
                .wait(left.max(Duration::from_millis(1)))
                .then_some(())
        })?;
        Ok(stopped.is_some())
    }
}
