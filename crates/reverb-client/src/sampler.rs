//! A prefetching sampler: background workers keep `max_in_flight_samples_per_worker` samples
//! requested from one table, decode them, and queue them for a consumer that takes batches.
//! Feeds the numpy / PyTorch iterators (and, later, the TensorFlow kernels).

use crate::{runtime, Client, ClientError, Result, Sample, Tensor};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Code;

/// Settings of a sampler (the reference's `Sampler::Options`).
#[derive(Debug, Clone)]
pub struct SamplerOptions {
    /// Samples each worker keeps requested.
    pub max_in_flight_samples_per_worker: usize,
    /// Worker count (each with its own stream).
    pub num_workers: usize,
    /// Total samples to return; `None` for unlimited.
    pub max_samples: Option<u64>,
    /// Ends the stream (cleanly) when the table's rate limiter blocks this long.
    pub rate_limiter_timeout: Option<Duration>,
}

/// What the queue carries.
enum Event {
    Sample(Box<Sample>),
    /// A worker is done (max_samples reached or the rate limiter timed out).
    Done,
    Failed(ClientError),
}

/// A running sampler. Dropping it stops the workers.
pub struct Sampler {
    rx: mpsc::Receiver<Event>,
    workers: Vec<tokio::task::JoinHandle<()>>,
    running: usize,
    failure: Option<ClientError>,
}

/// A batch: info columns and one stacked tensor per data column.
#[derive(Debug)]
pub struct Batch {
    /// `(key, probability, table_size, priority, times_sampled)` per sample.
    pub info: Vec<(u64, f64, i64, f64, i32)>,
    /// One tensor per column, with a leading batch dimension.
    pub columns: Vec<Tensor>,
}

impl Sampler {
    /// Starts the workers.
    pub fn new(client: Client, table: &str, options: SamplerOptions) -> Result<Self> {
        if options.max_in_flight_samples_per_worker < 1 {
            return Err(ClientError::invalid(
                "max_in_flight_samples_per_worker must be >= 1",
            ));
        }
        let num_workers = options.num_workers.max(1);
        let (tx, rx) = mpsc::channel(options.max_in_flight_samples_per_worker * num_workers);
        // Samples not yet requested (shared by the workers); i64::MAX when unlimited.
        let budget = Arc::new(AtomicI64::new(
            options.max_samples.map_or(i64::MAX, |m| m as i64),
        ));
        let workers = (0..num_workers)
            .map(|_| {
                runtime().spawn(worker(
                    client.clone(),
                    table.to_string(),
                    options.clone(),
                    budget.clone(),
                    tx.clone(),
                ))
            })
            .collect();
        Ok(Self {
            rx,
            workers,
            running: num_workers,
            failure: None,
        })
    }

    /// Takes up to `n` samples, waiting at most `wait` for the first one. Returns fewer at the
    /// end of the stream; `Ok(None)` when the wait passed with nothing ready; an empty vector
    /// once the stream has ended.
    pub async fn next(&mut self, n: usize, wait: Duration) -> Result<Option<Vec<Sample>>> {
        self.take(n, wait, true).await
    }

    /// Like [`Sampler::next`], but once the first sample is there it takes only the samples
    /// already queued (at most `n`) instead of waiting for `n`.
    pub async fn next_ready(&mut self, n: usize, wait: Duration) -> Result<Option<Vec<Sample>>> {
        self.take(n, wait, false).await
    }

    async fn take(&mut self, n: usize, wait: Duration, fill: bool) -> Result<Option<Vec<Sample>>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if let Some(e) = &self.failure {
                if out.is_empty() {
                    return Err(e.clone());
                }
                break;
            }
            if self.running == 0 {
                break;
            }
            let event = if out.is_empty() {
                match tokio::time::timeout(wait, self.rx.recv()).await {
                    Err(_) => return Ok(None),
                    Ok(e) => e,
                }
            } else if fill {
                self.rx.recv().await
            } else {
                match self.rx.try_recv() {
                    Ok(e) => Some(e),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                }
            };
            match event {
                Some(Event::Sample(s)) => out.push(*s),
                Some(Event::Done) | None => self.running = self.running.saturating_sub(1),
                Some(Event::Failed(e)) => {
                    self.running = self.running.saturating_sub(1);
                    self.failure = Some(e);
                }
            }
        }
        Ok(Some(out))
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        for w in &self.workers {
            w.abort();
        }
    }
}

async fn worker(
    client: Client,
    table: String,
    options: SamplerOptions,
    budget: Arc<AtomicI64>,
    tx: mpsc::Sender<Event>,
) {
    let mut backoff = Duration::from_millis(1);
    loop {
        // Reserve what this round asks for, so workers never exceed max_samples together.
        let want = options.max_in_flight_samples_per_worker as i64;
        let granted = budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                (left > 0).then(|| left - left.min(want))
            })
            .map(|left| left.min(want))
            .unwrap_or(0);
        if granted == 0 {
            let _ = tx.send(Event::Done).await;
            return;
        }
        let (samples, failure) = match client
            .sample_partial(&table, granted as usize, options.rate_limiter_timeout, None)
            .await
        {
            Ok(r) => r,
            Err(e) => (Vec::new(), Some(e)),
        };
        let received = samples.len() as i64;
        for sample in samples {
            if tx.send(Event::Sample(Box::new(sample))).await.is_err() {
                return; // the consumer went away
            }
        }
        // Give back what was reserved but not received.
        budget.fetch_add(granted - received, Ordering::SeqCst);
        match failure {
            None => backoff = Duration::from_millis(1),
            // A rate-limiter timeout ends the stream cleanly, as in the reference's datasets.
            Some(e) if e.code == Code::DeadlineExceeded => {
                let _ = tx.send(Event::Done).await;
                return;
            }
            Some(e) if matches!(e.code, Code::Unavailable | Code::Cancelled) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                if backoff >= Duration::from_secs(1) {
                    let _ = tx.send(Event::Failed(e)).await;
                    return;
                }
            }
            Some(e) => {
                let _ = tx.send(Event::Failed(e)).await;
                return;
            }
        }
    }
}

/// Stacks samples into a batch: every sample must have the same column dtypes and shapes.
pub fn stack(samples: Vec<Sample>) -> Result<Batch> {
    let n = samples.len();
    let mut info = Vec::with_capacity(n);
    let mut columns: Vec<Tensor> = Vec::new();
    for (i, sample) in samples.into_iter().enumerate() {
        let item = sample.info.item.unwrap_or_default();
        info.push((
            item.key,
            sample.info.probability,
            sample.info.table_size,
            item.priority,
            item.times_sampled,
        ));
        if i == 0 {
            columns = sample
                .columns
                .into_iter()
                .map(|t| {
                    let mut shape = Vec::with_capacity(t.shape.len() + 1);
                    shape.push(n as i64);
                    shape.extend_from_slice(&t.shape);
                    let mut data = Vec::with_capacity(t.data.len() * n);
                    data.extend_from_slice(&t.data);
                    Tensor {
                        dtype: t.dtype,
                        shape,
                        data,
                    }
                })
                .collect();
            continue;
        }
        if sample.columns.len() != columns.len() {
            return Err(ClientError::invalid(format!(
                "Sampled items have different numbers of columns ({} and {}): batch_size must be None",
                columns.len(),
                sample.columns.len()
            )));
        }
        for (c, (acc, t)) in columns.iter_mut().zip(sample.columns).enumerate() {
            if acc.dtype != t.dtype || acc.shape[1..] != t.shape[..] {
                return Err(ClientError::invalid(format!(
                    "Sampled items differ in column {c} (shapes {:?} and {:?}): they cannot be batched",
                    &acc.shape[1..],
                    t.shape
                )));
            }
            acc.data.extend_from_slice(&t.data);
        }
    }
    Ok(Batch { info, columns })
}
