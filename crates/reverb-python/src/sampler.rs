//! `reverb._native.Sampler`: the prefetching sampler behind `TrajectoryIterator` and
//! `TorchDataset`.

use crate::blocking::{join_error, slices};
use crate::client::{sample_info, samples_out, PyClient};
use crate::errors::IntoPyResult;
use crate::numpy::column_out;
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use reverb_client::runtime;
use reverb_client::sampler::ShardWatch;
use reverb_client::sampler::{stack, Batch, DecodedCache, Sampler, SamplerOptions};
use reverb_client::{Sample, Sampled};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Native half of `reverb.TrajectoryIterator`: a prefetching sampler handing out elements
/// of `n` samples, stacked into one batch or not. When the caller spends at least half as
/// long with an element as assembling one takes (a learner's step), the next element is
/// assembled ahead in the background, so the two overlap; a caller that only takes elements
/// has them assembled on its own thread (without the GIL), which is faster on few cores.
#[pyclass(name = "Sampler", module = "reverb._native", frozen)]
pub(crate) struct PySampler {
    state: Mutex<State>,
    /// Samples per element.
    n: usize,
    /// Whether they are stacked into one batch.
    stacked: bool,
    /// Whether elements may be assembled ahead: not from shards, where a sharded sampler
    /// assembling ahead was seen to stall a writer blocked on a rate limiter (CI, under
    /// load) and the cause is not known yet.
    ahead_allowed: bool,
    /// Which shards are missing (a sampler of several servers).
    shards: Option<ShardWatch>,
    /// When the sampler was made, and when it last handed out an element, in nanoseconds
    /// after that (0: never), set once the element is a Python object.
    created: Instant,
    handed_out: AtomicU64,
}

struct State {
    ahead: Ahead,
    /// How long assembling the last element took.
    assembly: Duration,
}

/// The sampler with what assembling takes (moved into the task assembling ahead).
struct Engine {
    sampler: Sampler,
    /// Compressed chunk tensors decoded for earlier batches.
    cache: DecodedCache,
}

/// An element assembled.
enum Element {
    /// The stream has ended.
    End,
    Batch(Batch),
    Samples(Vec<Sample>),
}

/// What assembling ahead returns: the engine back (unless assembling panicked), the element
/// and how long assembling it took.
type Assembled = (Option<Engine>, reverb_client::Result<Element>, Duration);

enum Ahead {
    /// Nothing assembled ahead.
    Idle(Engine),
    /// The next element is being assembled, or is ready.
    Running(Task),
    /// Closed, or the engine was lost.
    Closed,
}

/// The task assembling an element ahead, stopped when dropped (assembling for nobody, it
/// could wait on the table forever, holding the sampler and its workers).
struct Task(tokio::task::JoinHandle<Assembled>);

impl Task {
    fn start(mut engine: Engine, n: usize, stacked: bool) -> Self {
        Task(runtime().spawn(async move {
            let samples = loop {
                // (In short waits, as a caller's thread takes elements: a sharded sampler
                // waiting long in one call was seen to stall a rate-limited writer.)
                match engine.sampler.next(n, Duration::from_millis(100)).await {
                    Ok(Some(samples)) => break samples,
                    Ok(None) => continue,
                    Err(e) => return (Some(engine), Err(e), Duration::ZERO),
                }
            };
            let start = Instant::now();
            // (On the runtime's worker: `block_in_place` here, which hands the worker's other
            // tasks over, cost a learner's loop 12%.)
            let element = build(samples, &mut engine.cache, stacked);
            (Some(engine), element, start.elapsed())
        }))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The element of `samples` (the end of the stream when there are none).
fn build(
    samples: Vec<Sampled>,
    cache: &mut DecodedCache,
    stacked: bool,
) -> reverb_client::Result<Element> {
    if samples.is_empty() {
        Ok(Element::End)
    } else if stacked {
        stack(samples, cache).map(Element::Batch)
    } else {
        samples
            .into_iter()
            .map(|s| s.plan()?.assemble())
            .collect::<reverb_client::Result<Vec<_>>>()
            .map(Element::Samples)
    }
}

impl State {
    /// One slice of waiting for the next element (`None`: not there by `until`); `gap` is
    /// the caller's time with the last element.
    fn next(
        &mut self,
        n: usize,
        stacked: bool,
        gap: Option<Duration>,
        until: Instant,
    ) -> Option<reverb_client::Result<Element>> {
        let (engine, element) = match &mut self.ahead {
            Ahead::Closed => return Some(Ok(Element::End)),
            Ahead::Running(task) => {
                let until = tokio::time::Instant::from_std(until);
                let joined = runtime()
                    .block_on(async { tokio::time::timeout_at(until, &mut task.0).await.ok() })?;
                let (engine, element, took) =
                    joined.unwrap_or_else(|e| (None, Err(join_error(e)), Duration::ZERO));
                self.assembly = took;
                (engine, element)
            }
            Ahead::Idle(engine) => {
                let wait = until.saturating_duration_since(Instant::now());
                let samples = runtime()
                    .block_on(engine.sampler.next(n, wait.max(Duration::from_millis(1))))
                    .transpose()?;
                let start = Instant::now();
                let element = samples.and_then(|s| build(s, &mut engine.cache, stacked));
                self.assembly = start.elapsed();
                let Ahead::Idle(engine) = std::mem::replace(&mut self.ahead, Ahead::Closed) else {
                    unreachable!("matched above")
                };
                (Some(engine), element)
            }
        };
        // The caller's time with the last element against the time assembling one takes.
        let ahead_helps = gap.is_some_and(|gap| gap >= self.assembly / 2);
        self.ahead = match (engine, &element) {
            (Some(engine), Ok(Element::Batch(_) | Element::Samples(_))) if ahead_helps => {
                Ahead::Running(Task::start(engine, n, stacked))
            }
            (Some(engine), Ok(Element::Batch(_) | Element::Samples(_)) | Err(_)) => {
                Ahead::Idle(engine)
            }
            (_, Ok(Element::End)) | (None, _) => Ahead::Closed,
        };
        Some(element)
    }
}

#[pymethods]
impl PySampler {
    #[new]
    /// Samples `table` of the servers of `clients` (several: shards sampled as one table),
    /// `n` samples per element, stacked into one batch or not.
    #[pyo3(signature = (clients, table, *, n, stacked, max_in_flight_samples_per_worker, num_workers, max_samples, rate_limiter_timeout_ms))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        clients: Vec<PyRef<'_, PyClient>>,
        table: &str,
        n: usize,
        stacked: bool,
        max_in_flight_samples_per_worker: usize,
        num_workers: usize,
        max_samples: i64,
        rate_limiter_timeout_ms: i64,
    ) -> PyResult<Self> {
        if n == 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a sampler's elements must hold >= 1 sample",
            ));
        }
        let options = SamplerOptions {
            // A worker asking for less than a batch at a time needs several round trips per
            // batch.
            max_in_flight_samples_per_worker: if stacked {
                max_in_flight_samples_per_worker.max(n)
            } else {
                max_in_flight_samples_per_worker
            },
            num_workers,
            max_samples: (max_samples >= 0).then_some(max_samples as u64),
            rate_limiter_timeout: (rate_limiter_timeout_ms >= 0)
                .then(|| Duration::from_millis(rate_limiter_timeout_ms as u64)),
            // Read with the GIL held, as `REVERB_NO_INPROC` (see `inproc_allowed`).
            shared_memory: std::env::var_os("REVERB_NO_SHM").is_none_or(|v| v.is_empty()),
            // Stacked elements are rows of columns as our servers send them.
            columnar: stacked,
        };
        let ahead_allowed = clients.len() == 1;
        let sampler = {
            let _guard = runtime().enter();
            let clients = clients.iter().map(|c| c.fresh(py)).collect();
            Sampler::sharded(clients, table, options).py()?
        };
        Ok(Self {
            shards: sampler.watch(),
            state: Mutex::new(State {
                ahead: Ahead::Idle(Engine {
                    sampler,
                    cache: DecodedCache::default(),
                }),
                assembly: Duration::ZERO,
            }),
            n,
            stacked,
            ahead_allowed,
            created: Instant::now(),
            handed_out: AtomicU64::new(0),
        })
    }

    /// The next element: `None` once the stream has ended; otherwise, stacked,
    /// `(SampleInfo of arrays, [(dtype, shape, data)])` (fewer than `n` rows at the end), or
    /// unstacked a list like `Client.sample` returns.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let gap = match self.handed_out.load(Ordering::Relaxed) {
            _ if !self.ahead_allowed => None,
            0 => None,
            at => Some(
                self.created
                    .elapsed()
                    .saturating_sub(Duration::from_nanos(at)),
            ),
        };
        let assembled = slices(py, None, |until| {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.next(self.n, self.stacked, gap, until)
        })?
        .expect("no deadline");
        let out = self.to_python(py, assembled.py()?);
        let now = self.created.elapsed().as_nanos().clamp(1, u64::MAX as u128) as u64;
        self.handed_out.store(now, Ordering::Relaxed);
        out
    }

    /// Addresses of the shards that cannot be reached now.
    fn missing_shards(&self) -> Vec<String> {
        self.shards
            .as_ref()
            .map_or_else(Vec::new, ShardWatch::missing)
    }

    /// Stops the workers (and the assembling of the next element).
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.ahead = Ahead::Closed;
        });
    }
}

impl PySampler {
    /// An element as Python objects (see [`PySampler::next`]).
    fn to_python<'py>(
        &self,
        py: Python<'py>,
        element: Element,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let batch = match element {
            Element::End => return Ok(None),
            Element::Samples(samples) => return Ok(Some(samples_out(py, samples)?.into_any())),
            Element::Batch(batch) => batch,
        };
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
}
