//! A sampler of one server: a supervisor starts the workers, each keeping one sample stream
//! of [`Client::server`] full (requests pipelined within a budget of samples shared by the
//! workers), and queues what arrives for the consumer.

use super::pump::{pump, reserve, Sink, Window};
use super::{SamplerOptions, AUTO_WORKERS};
use crate::shards;
use crate::transport::shm;
use crate::transport::{SampleStreamOptions, Server};
use crate::{runtime, Client, ClientError, Result, Sampled};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};
use tonic::Code;

/// What the queue carries.
enum Event {
    /// Samples that arrived together (a response's), in order.
    Samples(Vec<Sampled>),
    /// Every worker is done (max_samples reached or the rate limiter timed out).
    Done,
    Failed(ClientError),
}

/// The queue's sending side: events, and room for samples (a worker waits for room for
/// what arrived before queueing it; the consumer makes room as it takes samples out).
#[derive(Clone)]
struct Tx {
    events: mpsc::UnboundedSender<Event>,
    room: Arc<Semaphore>,
    /// Samples queued at most.
    capacity: usize,
}

impl Tx {
    /// Queues an event other than samples.
    fn send(&self, event: Event) {
        let _ = self.events.send(event);
    }

    /// Resolves once the consumer went away.
    async fn closed(&self) {
        self.events.closed().await
    }
}
/// A running sampler of one server.
pub(crate) struct ServerSampler {
    rx: mpsc::UnboundedReceiver<Event>,
    /// Room for samples in the queue (see [`Tx`]).
    room: Arc<Semaphore>,
    /// Starts the workers and waits for them; aborting it aborts them (its `JoinSet`).
    supervisor: tokio::task::JoinHandle<()>,
    ended: bool,
    failure: Option<ClientError>,
    /// Samples received but not taken yet (by a call that timed out, by [`Self::fill_held`],
    /// or the rest of samples that arrived together beyond what a call took).
    held: VecDeque<Sampled>,
    /// The queue's capacity in samples (`fill_held` stops filling once it holds as many).
    capacity: usize,
    /// Samples not yet requested.
    budget: Arc<AtomicI64>,
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
        let (events, rx) = mpsc::unbounded_channel();
        let room = Arc::new(Semaphore::new(capacity));
        let tx = Tx {
            events,
            room: room.clone(),
            capacity,
        };
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
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..workers {
                let (table, options, budget, tx) =
                    (table.clone(), options.clone(), budget.clone(), tx.clone());
                set.spawn(worker(client.clone(), table, options, budget, tx));
            }
            while let Some(joined) = set.join_next().await {
                match joined {
                    // The first rate-limiter timeout ends the stream, as in the reference.
                    Ok(Exit::TimedOut) => set.abort_all(),
                    Ok(Exit::Finished) => {}
                    Err(e) if e.is_panic() => {
                        set.abort_all();
                        let e = ClientError::new(Code::Internal, "a sampler worker panicked");
                        tx.send(Event::Failed(e));
                    }
                    Err(_) => {} // aborted above
                }
            }
            tx.send(Event::Done);
        });
        Ok(Self {
            rx,
            room,
            supervisor,
            ended: false,
            failure: None,
            held: VecDeque::new(),
            capacity,
            budget: budget_left,
        })
    }

    /// Moves what the workers queued into `held` (samples, up to the queue's capacity, so
    /// workers still wait for room), noting the end of the stream or its failure.
    pub(crate) fn fill_held(&mut self) {
        while self.held.len() < self.capacity && !self.ended && self.failure.is_none() {
            match self.rx.try_recv() {
                Ok(Event::Samples(v)) => {
                    self.made_room(&v);
                    self.held.extend(v);
                }
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
    ) -> Result<Option<Vec<Sampled>>> {
        let deadline = tokio::time::Instant::now() + wait;
        // The oldest `n` held samples (the rest stay held).
        let mut out: Vec<Sampled> = self.held.drain(..n.min(self.held.len())).collect();
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
                        // Kept for the next call (nothing else is held now).
                        self.held = out.into();
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
                Some(Event::Samples(mut v)) => {
                    self.made_room(&v);
                    let wanted = n - out.len();
                    if v.len() > wanted {
                        self.held.extend(v.drain(wanted..));
                    }
                    out.append(&mut v);
                }
                Some(Event::Done) | None => self.ended = true,
                Some(Event::Failed(e)) => self.failure = Some(e),
            }
        }
        Ok(Some(out))
    }

    /// Makes room in the queue for as many samples as were taken out of it.
    fn made_room(&self, samples: &[Sampled]) {
        self.room.add_permits(samples.len().min(self.capacity));
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

/// Keeps one sample stream of [`Client::server`] full, reopening it when the connection
/// breaks (with backoff, for about a second of failures in a row).
async fn worker(
    client: Client,
    table: String,
    options: SamplerOptions,
    budget: Arc<AtomicI64>,
    tx: Tx,
) -> Exit {
    // One server for the worker's life (a server of this process stays one: a restarted
    // one is found on its port), and how long its streams are reopened after breaking.
    let server = client.server();
    let window = server.reconnect_window();
    let mut backoff = Duration::from_millis(1);
    loop {
        let mut received = 0usize;
        let streamed = stream(
            &*server,
            &client,
            &table,
            &options,
            &budget,
            &tx,
            &mut received,
        );
        let failure = match streamed.await {
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
            // The connection broke, or a server of this process stopped (it may be restarted
            // on its port): the stream is opened again.
            Code::Unavailable | Code::Cancelled
                if backoff < window && !failure.is_silent_server() =>
            {
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = tx.closed() => return Exit::Finished,
                }
                backoff *= 2;
            }
            _ => {
                tx.send(Event::Failed(failure));
                return Exit::Finished;
            }
        }
    }
}

/// The consumer's queue, as a pump's sink: an undecodable sample fails the worker (after
/// the samples before it are queued).
struct Queue<'a>(&'a Tx);

impl Sink for Queue<'_> {
    async fn put(&mut self, samples: Vec<Result<Sampled>>) -> Result<bool> {
        let mut ok = Vec::with_capacity(samples.len());
        let mut failure = None;
        for sample in samples {
            match sample {
                Ok(s) => ok.push(s),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if !ok.is_empty() {
            let room = ok.len().min(self.0.capacity) as u32;
            // (Room is never closed: an error cannot happen.)
            let Ok(permits) = self.0.room.acquire_many(room).await else {
                return Ok(false);
            };
            permits.forget(); // given back by the consumer as it takes them
            if self.0.events.send(Event::Samples(ok)).is_err() {
                return Ok(false);
            }
        }
        failure.map_or(Ok(true), Err)
    }

    async fn gone(&self) {
        self.0.closed().await
    }
}

/// Opens one sample stream and keeps it full ([`pump`]): about
/// `max_in_flight_samples_per_worker` samples always requested and not yet received. Returns
/// `Ok` once the budget is spent or the consumer has gone; on an error, gives back the
/// samples requested but not received.
async fn stream(
    server: &dyn Server,
    client: &Client,
    table: &str,
    options: &SamplerOptions,
    budget: &AtomicI64,
    tx: &Tx,
    received: &mut usize,
) -> Result<()> {
    let max_in_flight = options.max_in_flight_samples_per_worker;
    let outstanding = reserve(budget, max_in_flight);
    if outstanding == 0 {
        return Ok(());
    }
    let stream_options = SampleStreamOptions {
        ring_bytes: options
            .shared_memory
            .then(|| shm::ring_bytes(max_in_flight)),
        columnar: options.columnar,
        ..SampleStreamOptions::default()
    };
    let opened = async {
        server.ready("SampleStream", None, None).await?;
        // With a rate-limiter timeout the server answers within it (samples, or the
        // timeout): a server that has not even started answering a second later is not
        // going to.
        let opened = server.sample_stream(
            table,
            outstanding,
            options.rate_limiter_timeout,
            stream_options,
        );
        match options.rate_limiter_timeout {
            Some(t) => tokio::time::timeout(t + Duration::from_secs(1), opened)
                .await
                .unwrap_or_else(|_| {
                    Err(ClientError::deadline(format!(
                        "The server at {} did not answer within the rate limiter timeout ({} ms)",
                        client.address(),
                        t.as_millis()
                    )))
                }),
            None => opened.await,
        }
    };
    let mut stream = match opened.await {
        Ok(stream) => stream,
        Err(e) => {
            budget.fetch_add(outstanding as i64, Ordering::SeqCst);
            return Err(e);
        }
    };
    let window = Window {
        table,
        size: max_in_flight,
        rate_limiter_timeout: options.rate_limiter_timeout,
        budget,
    };
    pump(&mut *stream, window, outstanding, &mut Queue(tx), received).await
}
