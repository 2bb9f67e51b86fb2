//! `reverb._native.Sampler`: the prefetching sampler behind `TrajectoryIterator` and
//! `TorchDataset`.

use crate::blocking::slices;
use crate::client::{sample_info, samples_out, PyClient};
use crate::errors::IntoPyResult;
use crate::numpy::column_out;
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use reverb_client::runtime;
use reverb_client::sampler::ShardWatch;
use reverb_client::sampler::{stack, DecodedCache, Sampler, SamplerOptions};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Native half of `reverb.TrajectoryIterator`: a prefetching sampler.
#[pyclass(name = "Sampler", module = "reverb._native", frozen)]
pub(crate) struct PySampler {
    inner: Mutex<Option<Sampler>>,
    /// Compressed chunk tensors decoded for earlier batches.
    cache: Mutex<DecodedCache>,
    /// Which shards are missing (a sampler of several servers).
    shards: Option<ShardWatch>,
}

#[pymethods]
impl PySampler {
    #[new]
    /// Samples `table` of the servers of `clients` (several: shards sampled as one table).
    #[pyo3(signature = (clients, table, *, max_in_flight_samples_per_worker, num_workers, max_samples, rate_limiter_timeout_ms))]
    fn new(
        py: Python<'_>,
        clients: Vec<PyRef<'_, PyClient>>,
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
            // Read with the GIL held, as `REVERB_NO_INPROC` (see `inproc_allowed`).
            shared_memory: std::env::var_os("REVERB_NO_SHM").is_none_or(|v| v.is_empty()),
        };
        let sampler = {
            let _guard = runtime().enter();
            let clients = clients.iter().map(|c| c.fresh(py)).collect();
            Sampler::sharded(clients, table, options).py()?
        };
        Ok(Self {
            shards: sampler.watch(),
            inner: Mutex::new(Some(sampler)),
            cache: Mutex::default(),
        })
    }

    /// The next `n` samples: `None` once the stream has ended; otherwise, stacked,
    /// `(SampleInfo of arrays, [(dtype, shape, data)])` (fewer than `n` rows at the end), or
    /// unstacked a list like `Client.sample` returns.
    fn next<'py>(
        &self,
        py: Python<'py>,
        n: usize,
        stacked: bool,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let samples = slices(py, None, |until| {
            let mut guard = self.inner.lock().unwrap();
            let Some(sampler) = guard.as_mut() else {
                return Some(Ok(Vec::new()));
            };
            let wait = until.saturating_duration_since(Instant::now());
            runtime()
                .block_on(sampler.next(n, wait.max(Duration::from_millis(1))))
                .transpose()
        })?
        .expect("no deadline")
        .py()?;
        if samples.is_empty() {
            return Ok(None);
        }
        // Decompressing the columns is the heavy part: without the GIL.
        if !stacked {
            let samples = py
                .detach(|| {
                    samples
                        .into_iter()
                        .map(|s| s.plan()?.assemble())
                        .collect::<reverb_client::Result<Vec<_>>>()
                })
                .py()?;
            return Ok(Some(samples_out(py, samples)?.into_any()));
        }
        let batch = py
            .detach(|| {
                // (A batch that failed part-way leaves the cache consistent: take it as is.)
                let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
                stack(samples, &mut cache)
            })
            .py()?;
        let field = |f: fn(&(u64, f64, i64, f64, i32)) -> f64| {
            PyArray1::from_vec(py, batch.info.iter().map(f).collect())
        };
        let info = sample_info(
            py,
            PyArray1::from_vec(py, batch.info.iter().map(|i| i.0).collect()),
            field(|i| i.1),
            PyArray1::from_vec(py, batch.info.iter().map(|i| i.2).collect()),
            field(|i| i.3),
            PyArray1::from_vec(py, batch.info.iter().map(|i| i.4).collect()),
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

    /// Addresses of the shards that cannot be reached now.
    fn missing_shards(&self) -> Vec<String> {
        self.shards
            .as_ref()
            .map_or_else(Vec::new, ShardWatch::missing)
    }

    /// Stops the workers.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.inner.lock().unwrap().take());
    }
}
