//! A prefetching sampler: background workers keep `max_in_flight_samples_per_worker` samples
//! requested from one table, decode them, and queue them for a consumer that takes batches.
//! Feeds the numpy / PyTorch iterators and the TensorFlow kernels. A sampler of several
//! servers (shards) keeps one such sampler per shard and draws each sample from a shard
//! chosen by its weight ([`crate::shards`]).

use crate::client::sample_request;
use crate::sample::{plan, PartialSample};
use crate::shards::{self, ShardedSampler};
use crate::tensor::encode_strings;
use crate::transport::inproc::abi;
use crate::transport::shm::{self, Ring};
use crate::{runtime, Client, ClientError, PlannedSample, Result, Tensor};
use reverb_proto::inproc::Service;
use reverb_proto::sample_stream_response::SampleEntry;
use reverb_proto::shm::METADATA_KEY;
use reverb_proto::SampleStreamRequest;
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
    /// Worker count (each with its own stream); 0 picks [`AUTO_WORKERS`].
    pub num_workers: usize,
    /// Total samples to return; `None` for unlimited.
    pub max_samples: Option<u64>,
    /// Ends the stream (cleanly) when the table's rate limiter blocks this long.
    pub rate_limiter_timeout: Option<Duration>,
    /// The server runs in this process but is held by another library (the Python extension,
    /// seen from the TensorFlow kernels): sample it through that library's C ABI. (A server
    /// in this library's registry is found without it: [`Client::inproc`].)
    pub inproc_abi: Option<abi::Exported>,
    /// Offer a server on this host a shared-memory ring for chunk bytes (see [`crate::transport::shm`]).
    pub shared_memory: bool,
}

/// Workers when none are asked for: one per client runtime thread, so decoding runs on both.
pub const AUTO_WORKERS: usize = 2;

/// What the queue carries.
enum Event {
    Sample(Box<PlannedSample>),
    /// Every worker is done (max_samples reached or the rate limiter timed out).
    Done,
    Failed(ClientError),
}

/// A running sampler of one server or of several (shards). Dropping it stops the workers.
pub struct Sampler {
    inner: Inner,
}

enum Inner {
    Server(ServerSampler),
    Shards(Box<ShardedSampler>),
}

/// A running sampler of one server.
pub(crate) struct ServerSampler {
    rx: mpsc::Receiver<Event>,
    /// Starts the workers and waits for them; aborting it aborts them (its `JoinSet`).
    supervisor: tokio::task::JoinHandle<()>,
    ended: bool,
    failure: Option<ClientError>,
    /// Samples received but not taken yet (by a call that timed out, or [`Self::fill_held`]).
    held: Vec<PlannedSample>,
    /// The queue's capacity (also the most samples `fill_held` holds).
    capacity: usize,
    /// Samples not yet requested.
    budget: Arc<AtomicI64>,
}

/// A batch: info columns and one stacked tensor per data column.
#[derive(Debug)]
pub struct Batch {
    /// `(key, probability, table_size, priority, times_sampled)` per sample.
    pub info: Vec<(u64, f64, i64, f64, i32)>,
    /// One tensor per column, with a leading batch dimension.
    pub columns: Vec<Tensor>,
}

/// The worker count when none was asked for: one for tables sampled in a fixed order (FIFO,
/// LIFO, heaps), where parallel streams would reorder items, as the reference advises;
/// otherwise [`AUTO_WORKERS`]. The look-up waits no longer than `timeout` (the sampler's
/// rate-limiter timeout, when it has one).
async fn auto_workers(client: &Client, table: &str, timeout: Option<Duration>) -> usize {
    let infos = client.server_info(timeout).await.unwrap_or_default();
    let ordered = infos
        .iter()
        .find(|i| i.name == table)
        .is_none_or(shards::is_ordered);
    if ordered {
        1
    } else {
        AUTO_WORKERS
    }
}

impl Sampler {
    /// Starts the workers.
    pub fn new(client: Client, table: &str, options: SamplerOptions) -> Result<Self> {
        Ok(Self {
            inner: Inner::Server(ServerSampler::new(client, table, options)?),
        })
    }

    /// Samples `table` over all of `clients`' servers, each sample from a shard drawn in
    /// proportion to its weight, with its probability and table size made global (see
    /// [`crate::shards`]). One client is the same as [`Sampler::new`].
    pub fn sharded(mut clients: Vec<Client>, table: &str, options: SamplerOptions) -> Result<Self> {
        let inner = match clients.len() {
            0 => return Err(ClientError::invalid("a sampler needs at least one server")),
            1 => Inner::Server(ServerSampler::new(clients.remove(0), table, options)?),
            _ => Inner::Shards(Box::new(ShardedSampler::new(clients, table, options)?)),
        };
        Ok(Self { inner })
    }

    /// Takes `n` samples, waiting at most `wait` in all. Returns fewer at the end of the
    /// stream; `Ok(None)` when the wait passed first (samples that did arrive are kept for the
    /// next call); an empty vector once the stream has ended.
    pub async fn next(&mut self, n: usize, wait: Duration) -> Result<Option<Vec<PlannedSample>>> {
        self.take(n, wait, true).await
    }

    /// Like [`Sampler::next`], but once the first sample is there it takes only the samples
    /// already queued (at most `n`) instead of waiting for `n`.
    pub async fn next_ready(
        &mut self,
        n: usize,
        wait: Duration,
    ) -> Result<Option<Vec<PlannedSample>>> {
        self.take(n, wait, false).await
    }

    async fn take(
        &mut self,
        n: usize,
        wait: Duration,
        fill: bool,
    ) -> Result<Option<Vec<PlannedSample>>> {
        if n == 0 {
            return Err(ClientError::invalid(
                "a sampler call must ask for >= 1 sample",
            ));
        }
        match &mut self.inner {
            Inner::Server(s) => s.take(n, wait, fill).await,
            Inner::Shards(s) => s.take(n, wait, fill).await,
        }
    }

    /// Which shards cannot be reached (`None` for a sampler of one server).
    pub fn watch(&self) -> Option<shards::ShardWatch> {
        match &self.inner {
            Inner::Server(_) => None,
            Inner::Shards(s) => Some(s.watch()),
        }
    }
}

impl ServerSampler {
    /// Starts the workers.
    pub(crate) fn new(client: Client, table: &str, options: SamplerOptions) -> Result<Self> {
        // Samples not yet requested (shared by the workers); i64::MAX when unlimited.
        let budget = Arc::new(AtomicI64::new(
            options.max_samples.map_or(i64::MAX, |m| m as i64),
        ));
        Self::with_budget(client, table, options, budget)
    }

    /// Starts the workers, which request samples only while `budget` (samples not yet
    /// requested, shared with other samplers) is positive; `options.max_samples` is ignored.
    pub(crate) fn with_budget(
        client: Client,
        table: &str,
        options: SamplerOptions,
        budget: Arc<AtomicI64>,
    ) -> Result<Self> {
        if options.max_in_flight_samples_per_worker < 1 {
            return Err(ClientError::invalid(
                "max_in_flight_samples_per_worker must be >= 1",
            ));
        }
        let capacity =
            options.max_in_flight_samples_per_worker * options.num_workers.max(AUTO_WORKERS);
        let (tx, rx) = mpsc::channel(capacity);
        let budget_left = budget.clone();
        let table = table.to_string();
        let supervisor = runtime().spawn(async move {
            let workers = match options.num_workers {
                // (Bounded by the rate-limiter timeout, but never so short that a live
                // server cannot answer.)
                0 => {
                    let bound = options
                        .rate_limiter_timeout
                        .map(|t| t.max(Duration::from_secs(2)));
                    auto_workers(&client, &table, bound).await
                }
                n => n,
            };
            let inproc = match options.inproc_abi {
                Some(exported) => Some(InProc::Abi(exported)),
                None => client.inproc().map(InProc::Registered),
            };
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..workers {
                let (table, options, budget, tx) =
                    (table.clone(), options.clone(), budget.clone(), tx.clone());
                match &inproc {
                    Some(inproc) => {
                        let inproc = inproc.clone();
                        let client = client.clone();
                        set.spawn(inproc_worker(inproc, client, table, options, budget, tx))
                    }
                    None => set.spawn(worker(client.clone(), table, options, budget, tx)),
                };
            }
            while let Some(joined) = set.join_next().await {
                match joined {
                    // The first rate-limiter timeout ends the stream, as in the reference.
                    Ok(Exit::TimedOut) => set.abort_all(),
                    Ok(Exit::Finished) => {}
                    Err(e) if e.is_panic() => {
                        set.abort_all();
                        let e = ClientError::new(Code::Internal, "a sampler worker panicked");
                        let _ = tx.send(Event::Failed(e)).await;
                    }
                    Err(_) => {} // aborted above
                }
            }
            let _ = tx.send(Event::Done).await;
        });
        Ok(Self {
            rx,
            supervisor,
            ended: false,
            failure: None,
            held: Vec::new(),
            capacity,
            budget: budget_left,
        })
    }

    /// Moves what the workers queued into `held` (samples, up to the queue's capacity, so
    /// workers still wait for room), noting the end of the stream or its failure.
    pub(crate) fn fill_held(&mut self) {
        while self.held.len() < self.capacity && !self.ended && self.failure.is_none() {
            match self.rx.try_recv() {
                Ok(Event::Sample(s)) => self.held.push(*s),
                Ok(Event::Done) | Err(mpsc::error::TryRecvError::Disconnected) => self.ended = true,
                Ok(Event::Failed(e)) => self.failure = Some(e),
                Err(mpsc::error::TryRecvError::Empty) => break,
            }
        }
    }

    /// Samples held, ready to take (see [`Self::fill_held`]).
    pub(crate) fn held(&self) -> usize {
        self.held.len()
    }

    /// With nothing held: whether the stream ended, or how it failed.
    pub(crate) fn outcome(&self) -> Option<std::result::Result<(), &ClientError>> {
        if !self.held.is_empty() {
            return None;
        }
        match &self.failure {
            Some(e) => Some(Err(e)),
            None => self.ended.then_some(Ok(())),
        }
    }

    /// Whether every sample of the budget was requested.
    pub(crate) fn budget_spent(&self) -> bool {
        self.budget.load(Ordering::SeqCst) <= 0
    }

    /// Takes up to `n` samples (see [`Sampler::next`]; with `fill` false, as
    /// [`Sampler::next_ready`]).
    pub(crate) async fn take(
        &mut self,
        n: usize,
        wait: Duration,
        fill: bool,
    ) -> Result<Option<Vec<PlannedSample>>> {
        let deadline = tokio::time::Instant::now() + wait;
        // The oldest `n` held samples (the rest stay held).
        let rest = self.held.split_off(n.min(self.held.len()));
        let mut out = std::mem::replace(&mut self.held, rest);
        while out.len() < n {
            if let Some(e) = &self.failure {
                if out.is_empty() {
                    return Err(e.clone());
                }
                break;
            }
            if self.ended {
                break;
            }
            let event = if out.is_empty() || fill {
                match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                    Ok(e) => e,
                    Err(_) => {
                        out.append(&mut self.held);
                        self.held = out; // kept for the next call
                        return Ok(None);
                    }
                }
            } else {
                match self.rx.try_recv() {
                    Ok(e) => Some(e),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                }
            };
            match event {
                Some(Event::Sample(s)) => out.push(*s),
                Some(Event::Done) | None => self.ended = true,
                Some(Event::Failed(e)) => self.failure = Some(e),
            }
        }
        Ok(Some(out))
    }
}

impl Drop for ServerSampler {
    fn drop(&mut self) {
        self.supervisor.abort();
    }
}

/// How a worker ended (failures are reported through the queue).
enum Exit {
    Finished,
    TimedOut,
}

async fn worker(
    client: Client,
    table: String,
    options: SamplerOptions,
    budget: Arc<AtomicI64>,
    tx: mpsc::Sender<Event>,
) -> Exit {
    let mut backoff = Duration::from_millis(1);
    loop {
        let mut received = 0usize;
        let failure = match stream(&client, &table, &options, &budget, &tx, &mut received).await {
            Ok(()) => return Exit::Finished,
            Err(e) => e,
        };
        if received > 0 {
            backoff = Duration::from_millis(1);
        }
        match failure.code {
            // A rate-limiter timeout ends the stream cleanly, as in the reference's datasets
            // (without a rate-limiter timeout, DEADLINE_EXCEEDED is a real error).
            Code::DeadlineExceeded if options.rate_limiter_timeout.is_some() => {
                return Exit::TimedOut
            }
            Code::Unavailable | Code::Cancelled
                if backoff < Duration::from_secs(1) && !failure.is_silent_server() =>
            {
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            _ => {
                let _ = tx.send(Event::Failed(failure)).await;
                return Exit::Finished;
            }
        }
    }
}

/// A server of this process.
#[derive(Clone)]
enum InProc {
    /// In this library's registry.
    Registered(Arc<dyn Service>),
    /// Held by another library.
    Abi(abi::Exported),
}

impl InProc {
    /// One batch of up to `n` samples, waiting for the rate limiter at most `timeout`.
    async fn sample(
        &self,
        client: &Client,
        table: &str,
        n: usize,
        timeout: Option<Duration>,
    ) -> Result<Vec<PlannedSample>> {
        match self {
            InProc::Registered(server) => server
                .sample(table, n, timeout)
                .await
                .map_err(|s| client.inproc_status(s))?
                .into_iter()
                .map(|s| plan(s.info, &s.chunks))
                .collect(),
            InProc::Abi(exported) => exported.sample(table, n, timeout).await,
        }
    }
}

/// How long an in-process worker keeps looking for its stopped server (backoff doubling from
/// 1 ms while below this: about twice this in all).
const INPROC_RETRY: Duration = Duration::from_secs(2);

/// A worker for a server in this process: takes what is ready (up to
/// `max_in_flight_samples_per_worker`) in one call at a time.
async fn inproc_worker(
    mut inproc: InProc,
    client: Client,
    table: String,
    options: SamplerOptions,
    budget: Arc<AtomicI64>,
    tx: mpsc::Sender<Event>,
) -> Exit {
    let give_back = |n: usize| budget.fetch_add(n as i64, Ordering::SeqCst);
    let mut backoff = Duration::from_millis(1);
    loop {
        let n = reserve(&budget, options.max_in_flight_samples_per_worker);
        if n == 0 {
            return Exit::Finished;
        }
        let got = tokio::select! {
            got = inproc.sample(&client, &table, n, options.rate_limiter_timeout) => got,
            _ = tx.closed() => return Exit::Finished,
        };
        let samples = match got {
            Ok(samples) => {
                backoff = Duration::from_millis(1);
                samples
            }
            Err(e) => {
                give_back(n);
                // A rate-limiter timeout ends the stream cleanly (see `worker`).
                if e.code == Code::DeadlineExceeded && options.rate_limiter_timeout.is_some() {
                    return Exit::TimedOut;
                }
                // A stopped server may be restarted on its port: look it up again for a few
                // seconds (a stop itself may take a second).
                let registered = matches!(inproc, InProc::Registered(_));
                if registered && e.code == Code::Unavailable && backoff < INPROC_RETRY {
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = tx.closed() => return Exit::Finished,
                    }
                    backoff *= 2;
                    if let Some(server) = client.inproc() {
                        inproc = InProc::Registered(server);
                    }
                    continue;
                }
                let _ = tx.send(Event::Failed(e)).await;
                return Exit::Finished;
            }
        };
        give_back(n - samples.len().min(n));
        for sample in samples {
            if tx.send(Event::Sample(Box::new(sample))).await.is_err() {
                return Exit::Finished;
            }
        }
    }
}

/// Takes up to `want` samples from the shared budget; returns how many were granted.
fn reserve(budget: &AtomicI64, want: usize) -> usize {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            (left > 0).then(|| left - left.min(want as i64))
        })
        .map(|left| left.min(want as i64) as usize)
        .unwrap_or(0)
}

/// One `SampleStream` kept full: requests are pipelined so that about
/// `max_in_flight_samples_per_worker` samples are always requested and not yet received (a
/// new request goes out once half of them have arrived). Returns `Ok` once the budget is spent
/// or the consumer has gone; on an error, gives back the samples requested but not received.
async fn stream(
    client: &Client,
    table: &str,
    options: &SamplerOptions,
    budget: &AtomicI64,
    tx: &mpsc::Sender<Event>,
    received: &mut usize,
) -> Result<()> {
    let max_in_flight = options.max_in_flight_samples_per_worker;
    let (requests, rx) = mpsc::channel(4);
    let mut outstanding = reserve(budget, max_in_flight);
    if outstanding == 0 {
        return Ok(());
    }
    let ring = (options.shared_memory && shm::is_this_host(client.address()))
        .then(|| Ring::create(shm::ring_bytes(max_in_flight)).ok())
        .flatten();
    // New requests also report how much of the ring is consumed (a request that cannot be
    // sent ends the stream, ring and all).
    let request = |n| SampleStreamRequest {
        shm_released: ring.as_ref().and_then(Ring::report).unwrap_or(0),
        ..sample_request(table, n, options.rate_limiter_timeout)
    };
    let _ = requests.send(request(outstanding)).await;
    let give_back = |outstanding: usize| budget.fetch_add(outstanding as i64, Ordering::SeqCst);
    let mut metadata = tonic::metadata::MetadataMap::new();
    if let Some(offer) = ring.as_ref().and_then(|r| r.offer().parse().ok()) {
        metadata.insert(METADATA_KEY, offer);
    }
    if let Err(e) = client.wait_reachable("SampleStream", None).await {
        give_back(outstanding);
        return Err(e);
    }
    // With a rate-limiter timeout the server answers within it (samples, or the timeout):
    // a server that has not even started answering a second later is not going to.
    let started = client.sample_stream(rx, metadata);
    let started = match options.rate_limiter_timeout {
        Some(t) => match tokio::time::timeout(t + Duration::from_secs(1), started).await {
            Ok(started) => started,
            Err(_) => {
                give_back(outstanding);
                return Err(ClientError::deadline(format!(
                    "The server at {} did not answer within the rate limiter timeout ({} ms)",
                    client.address(),
                    t.as_millis()
                )));
            }
        },
        None => started.await,
    };
    let mut responses = match started {
        Ok(r) => r,
        Err(status) => {
            give_back(outstanding);
            return Err(client.status(status));
        }
    };
    let mut partial = PartialSample::default();
    loop {
        if outstanding <= max_in_flight / 2 {
            let more = reserve(budget, max_in_flight - outstanding);
            if more > 0 {
                let _ = requests.send(request(more)).await;
                outstanding += more;
            } else if outstanding == 0 {
                return Ok(());
            }
        }
        let response = match responses.message().await {
            Ok(Some(r)) => r,
            Ok(None) => {
                give_back(outstanding);
                return Err(ClientError::new(
                    Code::Internal,
                    format!(
                        "Server at {} ended the sample stream early",
                        client.address()
                    ),
                ));
            }
            Err(status) => {
                give_back(outstanding);
                return Err(client.status(status));
            }
        };
        // Releases are reported each time another sixteenth of the ring is free.
        if let Some((ring, released)) = ring
            .as_ref()
            .and_then(|r| Some((r, r.unreported(r.size() as u64 / 16)?)))
        {
            let report = SampleStreamRequest {
                shm_released: released,
                ..Default::default()
            };
            // When the queue is full, the next response tries again.
            if requests.try_send(report).is_ok() {
                ring.reported(released);
            }
        }
        for mut entry in response.entries {
            let complete = match from_ring(&mut entry, ring.as_ref(), client.address())
                .and_then(|()| partial.add(entry))
            {
                Ok(complete) => complete,
                Err(e) => {
                    give_back(outstanding);
                    return Err(e);
                }
            };
            if let Some((info, chunks)) = complete {
                if outstanding == 0 {
                    return Err(ClientError::data_loss(format!(
                        "Server at {} sent more samples than requested",
                        client.address()
                    )));
                }
                outstanding -= 1;
                *received += 1;
                let sample = match plan(info, &chunks) {
                    Ok(sample) => sample,
                    Err(e) => {
                        give_back(outstanding);
                        return Err(e);
                    }
                };
                if tx.send(Event::Sample(Box::new(sample))).await.is_err() {
                    return Ok(()); // the consumer went away
                }
            }
        }
    }
}

/// Replaces the entry's shared-memory chunk references by the bytes they point to.
fn from_ring(entry: &mut SampleEntry, ring: Option<&Ring>, address: &str) -> Result<()> {
    for chunk in entry.data.iter_mut().filter(|c| c.shm_length > 0) {
        let bytes = match ring {
            _ if !chunk.data.is_empty() => Err("it also has inline bytes".to_string()),
            Some(ring) => ring.take(chunk.shm_position, chunk.shm_length),
            None => Err("no ring was offered".to_string()),
        };
        chunk.data = bytes.map_err(|e| {
            ClientError::data_loss(format!(
                "Server at {address} sent a bad shared-memory chunk: {e}"
            ))
        })?;
        chunk.shm_length = 0;
        chunk.shm_position = 0;
    }
    Ok(())
}

/// Stacks samples into a batch: every sample must have the same column dtypes and shapes.
/// Each column is decompressed straight into its place in the batch.
pub fn stack(samples: Vec<PlannedSample>) -> Result<Batch> {
    let n = samples.len();
    let Some(first) = samples.first() else {
        return Ok(Batch {
            info: Vec::new(),
            columns: Vec::new(),
        });
    };
    for sample in &samples[1..] {
        if sample.columns.len() != first.columns.len() {
            return Err(ClientError::invalid(format!(
                "Sampled items have different numbers of columns ({} and {}): batch_size must be None",
                first.columns.len(),
                sample.columns.len()
            )));
        }
        for (c, (a, t)) in first.columns.iter().zip(&sample.columns).enumerate() {
            if a.dtype != t.dtype || a.shape != t.shape {
                return Err(ClientError::invalid(format!(
                    "Sampled items differ in column {c} (shapes {:?} and {:?}): they cannot be batched",
                    a.shape, t.shape
                )));
            }
        }
    }
    let mut columns = Vec::with_capacity(first.columns.len());
    for (c, column) in first.columns.iter().enumerate() {
        let mut shape = Vec::with_capacity(column.shape.len() + 1);
        shape.push(n as i64);
        shape.extend_from_slice(&column.shape);
        if column.is_string() {
            // Elements of every sample's column, in order, as one string list.
            let per_sample: usize = column.shape.iter().map(|&d| d as usize).product();
            let tensors = samples
                .iter()
                .map(|s| s.columns[c].to_tensor())
                .collect::<Result<Vec<_>>>()?;
            let mut elements: Vec<&[u8]> = Vec::with_capacity(n * per_sample);
            for t in &tensors {
                elements.extend(t.strings()?);
            }
            columns.push(Tensor {
                dtype: column.dtype,
                shape,
                data: encode_strings(elements.iter().copied()),
            });
            continue;
        }
        let size = column.byte_len();
        let total = size
            .checked_mul(n)
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or_else(|| {
                ClientError::invalid(format!("A batch of {n} x {size} bytes is too large"))
            })?;
        let mut data = vec![0u8; total];
        for (sample, out) in samples.iter().zip(data.chunks_exact_mut(size.max(1))) {
            sample.columns[c].write_to(&mut out[..size])?;
        }
        columns.push(Tensor {
            dtype: column.dtype,
            shape,
            data,
        });
    }
    let info = samples
        .into_iter()
        .map(|sample| {
            let item = sample.info.item.unwrap_or_default();
            (
                item.key,
                sample.info.probability,
                sample.info.table_size,
                item.priority,
                item.times_sampled,
            )
        })
        .collect();
    Ok(Batch { info, columns })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reverb_proto::ChunkData;

    fn entry(position: u64, length: u64) -> SampleEntry {
        SampleEntry {
            data: vec![ChunkData {
                shm_position: position,
                shm_length: length,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn ring_references_without_a_ring_or_outside_it_are_data_loss() {
        let err = from_ring(&mut entry(0, 10), None, "here:1").unwrap_err();
        assert_eq!(err.code, Code::DataLoss);
        assert!(
            err.message.contains("no ring was offered"),
            "{}",
            err.message
        );
        let ring = Ring::create(1 << 20).unwrap();
        let err = from_ring(&mut entry(1 << 20, 10), Some(&ring), "here:1").unwrap_err();
        assert!(err.message.contains("outside the ring"), "{}", err.message);
        let mut both = entry(0, 10);
        both.data[0].data = vec![1].into();
        let err = from_ring(&mut both, Some(&ring), "here:1").unwrap_err();
        assert!(
            err.message.contains("also has inline bytes"),
            "{}",
            err.message
        );
        let mut ok = entry(0, 10);
        from_ring(&mut ok, Some(&ring), "here:1").unwrap();
        assert_eq!((ok.data[0].data.len(), ok.data[0].shm_length), (10, 0));
    }
}
