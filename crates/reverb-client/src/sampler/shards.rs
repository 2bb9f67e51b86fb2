//! A sampler of several servers (shards) used as one table: one [`ServerSampler`] per shard,
//! each sample from a shard drawn by its weight ([`crate::shards`]).

use super::server::ServerSampler;
use super::SamplerOptions;
use crate::shards::{draw_weights, ShardWeight, MAX_SHARDS};
use crate::{runtime, Client, ClientError, Result, Sampled};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tonic::Code;

/// How often a sharded sampler asks each shard for its table's weight.
const REFRESH_EVERY: Duration = Duration::from_millis(100);
/// How long one such question may take (a shard that does not answer in time is missing).
const REFRESH_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a consumer waits for the shard it drew before looking again at what it knows of
/// it (gone missing, emptied, or blocked by its rate limiter while others have samples).
const PATIENCE: Duration = Duration::from_millis(50);
/// The most draws owed to one shard (see [`ShardedSampler`]).
const MAX_OWED: u32 = 100_000;

/// Which shards of a sharded sampler are missing (see [`crate::sampler::Sampler::watch`]).
#[derive(Clone)]
pub struct ShardWatch {
    addresses: Vec<String>,
    states: watch::Receiver<Vec<ShardState>>,
}

impl ShardWatch {
    /// Addresses of the shards that cannot be reached now.
    pub fn missing(&self) -> Vec<String> {
        let states = self.states.borrow();
        self.addresses
            .iter()
            .zip(states.iter())
            .filter(|(_, s)| matches!(s, ShardState::Missing(_)))
            .map(|(a, _)| a.clone())
            .collect()
    }
}

/// One shard as its sampler last heard of it.
#[derive(Debug, Clone)]
enum ShardState {
    /// Not asked yet.
    Unknown,
    /// Did not answer, or a sample stream from it broke; the error says why.
    Missing(ClientError),
    /// Answered: its table's weight (`None`: no such table there).
    Known(Option<ShardWeight>),
}

/// A sampler of several servers: one [`ServerSampler`] per shard (each keeping its samples
/// requested), and each sample from a shard drawn in proportion to its weight (refreshed
/// every [`REFRESH_EVERY`]; where sampling deletes items, the samples its sampler holds count
/// as items too), so samples follow the distribution of one table holding every shard's
/// items. A drawn shard is waited for, except when its rate limiter blocks sampling while
/// other shards have samples ready (one writer blocked on that shard's inserts could
/// otherwise wait for this sampler for ever): the draw is then owed to it, and owed draws
/// are served first once it has samples again. Missing shards are not drawn until they
/// answer again. With `max_samples` on tables where sampling deletes items, each shard's
/// sampler requests at most that many. The stream ends (with a rate-limiter timeout) once
/// every shard's sampler has ended on it since the last sample.
pub(crate) struct ShardedSampler {
    table: String,
    /// Options of each shard's sampler.
    options: SamplerOptions,
    /// `max_samples` as asked.
    max_samples: Option<u64>,
    clients: Vec<Client>,
    samplers: Vec<Option<ServerSampler>>,
    states: Arc<watch::Sender<Vec<ShardState>>>,
    changes: watch::Receiver<Vec<ShardState>>,
    refreshers: Vec<tokio::task::JoinHandle<()>>,
    /// Each shard's last known weight (for samples it sent before it went missing).
    last_weight: Vec<Option<ShardWeight>>,
    /// Draws owed to each shard (see above).
    owed: Vec<u32>,
    /// Shards whose sampler ended on the rate-limiter timeout since the last sample.
    timed_out: Vec<bool>,
    /// Shards whose sampler requested all of `max_samples` and ended.
    exhausted: Vec<bool>,
    /// The shard the next sample comes from, once drawn (kept across calls that time out, so
    /// a slow shard is not drawn less often).
    chosen: Option<usize>,
    /// Samples a timed-out call received, returned by the next call.
    held: Vec<Sampled>,
    /// Samples still to return (`max_samples`).
    left: Option<u64>,
    ended: bool,
    failure: Option<ClientError>,
    /// Since when every shard has been missing.
    all_missing_since: Option<Instant>,
    /// How long every shard may be missing before the sampler fails: as long as a call
    /// waits for one server that cannot be reached ([`crate::client::connect_wait`]).
    connect_wait: Duration,
}

impl ShardedSampler {
    pub(crate) fn new(clients: Vec<Client>, table: &str, options: SamplerOptions) -> Result<Self> {
        if clients.len() > MAX_SHARDS {
            return Err(ClientError::invalid(format!(
                "A sampler reads at most {MAX_SHARDS} shards, got {}",
                clients.len()
            )));
        }
        let n = clients.len();
        let (states, changes) = watch::channel(vec![ShardState::Unknown; n]);
        let states = Arc::new(states);
        let refreshers = clients
            .iter()
            .enumerate()
            .map(|(i, client)| {
                runtime().spawn(refresh(
                    client.clone(),
                    table.to_string(),
                    i,
                    states.clone(),
                ))
            })
            .collect();
        Ok(Self {
            table: table.to_string(),
            left: options.max_samples,
            max_samples: options.max_samples,
            options: SamplerOptions {
                max_samples: None,
                ..options
            },
            samplers: clients.iter().map(|_| None).collect(),
            clients,
            states,
            changes,
            refreshers,
            last_weight: vec![None; n],
            owed: vec![0; n],
            timed_out: vec![false; n],
            exhausted: vec![false; n],
            chosen: None,
            held: Vec::new(),
            ended: false,
            failure: None,
            all_missing_since: None,
            connect_wait: crate::client::connect_wait(),
        })
    }

    /// A view of which shards are missing, usable while the sampler is busy.
    pub(crate) fn watch(&self) -> ShardWatch {
        ShardWatch {
            addresses: self
                .clients
                .iter()
                .map(|c| c.address().to_string())
                .collect(),
            states: self.changes.clone(),
        }
    }

    /// Takes up to `n` samples (see [`crate::sampler::Sampler::next`]). Not cancellation
    /// safe: callers wait for it to return (samples it took would be lost otherwise).
    pub(crate) async fn take(
        &mut self,
        n: usize,
        wait: Duration,
        fill: bool,
    ) -> Result<Option<Vec<Sampled>>> {
        let deadline = Instant::now() + wait;
        let mut out = std::mem::take(&mut self.held);
        while out.len() < n {
            if let Some(e) = &self.failure {
                if out.is_empty() {
                    return Err(e.clone());
                }
                break;
            }
            if self.ended || self.left == Some(0) {
                self.ended = true;
                break;
            }
            self.samplers
                .iter_mut()
                .flatten()
                .for_each(ServerSampler::fill_held);
            // Samplers that ended or failed with nothing left, drawn or not.
            for shard in 0..self.samplers.len() {
                let outcome = self.samplers[shard].as_ref().and_then(|x| {
                    x.outcome()
                        .map(|o| (o.map_err(ClientError::clone), x.budget_spent()))
                });
                match outcome {
                    Some((Ok(()), spent)) => self.sampler_ended(shard, spent),
                    Some((Err(e), _)) => self.sampler_failed(shard, e),
                    None => {}
                }
            }
            if self.failure.is_some() {
                continue;
            }
            // Once a sample is there, a call that does not fill takes only what is ready.
            let ready_only = !fill && !out.is_empty();
            // Owed draws first, from shards that have samples ready.
            let owed = (0..self.owed.len()).find(|&s| self.owed[s] > 0 && self.ready(s));
            let shard = match (owed, self.chosen) {
                (Some(s), _) => s,
                (None, Some(s)) => s,
                (None, None) => match self.draw() {
                    Draw::Shard(s) => s,
                    Draw::Fail(e) => {
                        self.failure = Some(e);
                        continue;
                    }
                    Draw::End => {
                        self.ended = true;
                        continue;
                    }
                    Draw::Wait if ready_only => break,
                    Draw::Wait => {
                        // (The refreshers change the states every REFRESH_EVERY.)
                        let changed = self.changes.changed();
                        match tokio::time::timeout_at(deadline.into(), changed).await {
                            Ok(_) => continue,
                            Err(_) => {
                                self.held = out;
                                return Ok(None);
                            }
                        }
                    }
                },
            };
            if owed.is_none() {
                self.chosen = Some(shard);
                if !self.ready(shard) && self.blocked(shard) && self.others_ready(shard) {
                    self.owe(shard);
                    continue;
                }
            }
            let slice = if ready_only || owed.is_some() {
                Duration::ZERO
            } else {
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(PATIENCE)
            };
            let Some(sampler) = self.samplers[shard].as_mut() else {
                self.forget(shard); // (its sampler ended since it was drawn)
                continue;
            };
            match sampler.take(1, slice, true).await {
                // (What looked ready was not a sample after all.)
                Ok(None) if owed.is_some() => self.owed[shard] = 0,
                Ok(None) if ready_only => break,
                Ok(None) => {
                    self.reconsider(shard);
                    if Instant::now() >= deadline {
                        self.held = out;
                        return Ok(None);
                    }
                }
                Ok(Some(v)) if v.is_empty() => {
                    let spent = self.samplers[shard]
                        .as_ref()
                        .is_some_and(ServerSampler::budget_spent);
                    self.sampler_ended(shard, spent);
                }
                Ok(Some(mut v)) => {
                    let mut sample = v.pop().expect("one sample");
                    self.globalize(&mut sample, shard);
                    out.push(sample);
                    self.timed_out.iter_mut().for_each(|t| *t = false);
                    match owed {
                        Some(s) => self.owed[s] -= 1,
                        None => self.forget(shard),
                    }
                    self.left = self.left.map(|l| l - 1);
                }
                Err(e) => self.sampler_failed(shard, e),
            }
        }
        Ok(Some(out))
    }

    /// Shard `shard`'s sampler ended: it requested all of `max_samples` (`spent`), or its
    /// rate limiter blocked for the rate-limiter timeout (its sampler starts again at the
    /// next draw; the whole stream ends once every shard's did since the last sample).
    fn sampler_ended(&mut self, shard: usize, spent: bool) {
        self.samplers[shard] = None;
        self.owed[shard] = 0;
        self.forget(shard);
        if spent {
            self.exhausted[shard] = true;
        } else {
            self.timed_out[shard] = true;
        }
    }

    /// Shard `shard`'s sampler failed: a lost server is missing until it answers again;
    /// another error fails the whole sampler (as it fails a sampler of one server).
    fn sampler_failed(&mut self, shard: usize, e: ClientError) {
        if !is_lost_shard(&e) {
            self.failure = Some(e);
            return;
        }
        self.samplers[shard] = None;
        self.owed[shard] = 0;
        self.forget(shard);
        self.states
            .send_modify(|s| s[shard] = ShardState::Missing(e));
    }

    /// Forgets the pending draw if it was of `shard`.
    fn forget(&mut self, shard: usize) {
        if self.chosen == Some(shard) {
            self.chosen = None;
        }
    }

    /// Owes `shard` its pending draw (see [`ShardedSampler`]).
    fn owe(&mut self, shard: usize) {
        self.forget(shard);
        self.owed[shard] = (self.owed[shard] + 1).min(MAX_OWED);
    }

    /// Whether shard `s`'s sampler holds a sample.
    fn ready(&self, s: usize) -> bool {
        self.samplers[s].as_ref().is_some_and(|x| x.held() > 0)
    }

    /// Whether another shard than `shard` holds a sample.
    fn others_ready(&self, shard: usize) -> bool {
        (0..self.clients.len()).any(|s| s != shard && self.ready(s))
    }

    /// Whether `shard`'s rate limiter blocks sampling, as last heard.
    fn blocked(&self, shard: usize) -> bool {
        matches!(self.changes.borrow()[shard], ShardState::Known(Some(w)) if w.sampling_blocked)
    }

    /// The drawn shard `shard` had no sample within [`PATIENCE`]: stop waiting for it if it
    /// went missing or emptied, or (owing it the draw) if its rate limiter blocks sampling
    /// while other shards have samples ready.
    fn reconsider(&mut self, shard: usize) {
        let state = self.changes.borrow()[shard].clone();
        match state {
            ShardState::Missing(_) => self.forget(shard),
            ShardState::Known(Some(w)) if w.size == 0 && !self.ready(shard) => self.forget(shard),
            ShardState::Known(Some(w)) if w.sampling_blocked && self.others_ready(shard) => {
                self.owe(shard)
            }
            _ => {}
        }
    }

    /// Starts the sampler of every shard that has the table and has none (unless it
    /// requested all of `max_samples` already). A shard's sampler is stopped only by its
    /// own stream's end or failure.
    fn start_samplers(&mut self, states: &[ShardState]) -> Result<()> {
        for (shard, state) in states.iter().enumerate() {
            let ShardState::Known(Some(weight)) = state else {
                continue;
            };
            if self.samplers[shard].is_none() && !self.exhausted[shard] {
                // Only where sampling deletes items does `max_samples` bound what a shard's
                // sampler requests: elsewhere samples requested but never taken cost
                // nothing, and an unbounded prefetch keeps the draw's proportions to the end.
                let max_samples = self.max_samples.filter(|_| weight.sampling_deletes);
                self.samplers[shard] = Some(ServerSampler::new(
                    self.clients[shard].clone(),
                    &self.table,
                    SamplerOptions {
                        max_samples,
                        ..self.options.clone()
                    },
                )?);
            }
        }
        Ok(())
    }

    /// Draws the shard of the next sample.
    fn draw(&mut self) -> Draw {
        let states = self.changes.borrow_and_update().clone();
        // Draws need every shard's weight (a dead one is known to be missing within
        // REFRESH_TIMEOUT).
        if states.iter().any(|s| matches!(s, ShardState::Unknown)) {
            return Draw::Wait;
        }
        if let Err(e) = self.start_samplers(&states) {
            return Draw::Fail(e);
        }
        for (last, state) in self.last_weight.iter_mut().zip(&states) {
            if let ShardState::Known(Some(w)) = state {
                *last = Some(*w);
            }
        }
        let weights: Vec<Option<ShardWeight>> = states
            .iter()
            .enumerate()
            .map(|(i, s)| match s {
                ShardState::Known(Some(w)) if self.samplers[i].is_some() => {
                    Some(self.with_held(i, *w))
                }
                _ => None,
            })
            .collect();
        let with_table: Vec<usize> = (0..states.len())
            .filter(|&i| matches!(states[i], ShardState::Known(Some(_))))
            .collect();
        // Every shard's sampler ended on the rate-limiter timeout (or requested all of
        // `max_samples`) since the last sample, and none has anything left: the stream ends.
        let done = |i: &usize| self.timed_out[*i] || self.exhausted[*i];
        if !with_table.is_empty()
            && with_table.iter().all(done)
            && !(0..self.clients.len()).any(|s| self.ready(s))
        {
            return Draw::End;
        }
        let draw = draw_weights(&weights);
        let total: f64 = draw.iter().sum();
        if total > 0.0 {
            self.all_missing_since = None;
            let mut target = rand::random::<f64>() * total;
            for (i, &w) in draw.iter().enumerate() {
                if target < w {
                    return Draw::Shard(i);
                }
                target -= w;
            }
            return Draw::Shard(draw.iter().rposition(|&w| w > 0.0).expect("total > 0"));
        }
        // Nothing to draw by weight, but samples held (e.g. of a shard that went missing
        // since): they go first.
        if let Some(s) = (0..self.clients.len()).find(|&s| self.ready(s)) {
            return Draw::Shard(s);
        }
        if !with_table.is_empty() {
            // Every table is empty (or its samplers wait for their servers' rate limiters).
            self.all_missing_since = None;
            return Draw::Wait;
        }
        // Every shard that answered lacks the table: one that answered reports the server's
        // error through a sampler of its own.
        if let Some(i) = states
            .iter()
            .position(|s| matches!(s, ShardState::Known(None)))
        {
            if self.samplers[i].is_none() {
                match ServerSampler::new(self.clients[i].clone(), &self.table, self.options.clone())
                {
                    Ok(sampler) => self.samplers[i] = Some(sampler),
                    Err(e) => return Draw::Fail(e),
                }
            }
            return Draw::Shard(i);
        }
        // Every shard is missing: as a call to one server that cannot be reached, wait for
        // one, then fail.
        let since = *self.all_missing_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= self.connect_wait {
            let why = states
                .iter()
                .find_map(|s| match s {
                    ShardState::Missing(e) => Some(e.message.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            return Draw::Fail(ClientError::new(
                Code::Unavailable,
                format!(
                    "None of the {} servers of table '{}' can be reached ({why})",
                    states.len(),
                    self.table,
                ),
            ));
        }
        Draw::Wait
    }

    /// Shard `i`'s weight counting, where sampling deletes items, the samples its sampler
    /// holds as items still in its table (the server no longer counts them).
    fn with_held(&self, i: usize, w: ShardWeight) -> ShardWeight {
        let held = self.samplers[i].as_ref().map_or(0, ServerSampler::held) as i64;
        if !w.sampling_deletes || held == 0 {
            return w;
        }
        let mean = if w.size > 0 {
            w.total_weight / w.size as f64
        } else {
            1.0
        };
        ShardWeight {
            size: w.size + held,
            total_weight: w.total_weight + mean * held as f64,
            ..w
        }
    }

    /// Makes a shard's sample info global: its probability times the shard's share of the
    /// draw, and the table size summed over the shards (its own shard, if missing now, as it
    /// was last known).
    fn globalize(&self, sample: &mut Sampled, shard: usize) {
        let mut weights: Vec<Option<ShardWeight>> = self
            .changes
            .borrow()
            .iter()
            .map(|s| match s {
                ShardState::Known(w) => *w,
                _ => None,
            })
            .collect();
        if weights[shard].is_none() {
            weights[shard] = self.last_weight[shard];
        }
        let draw = draw_weights(&weights);
        let total: f64 = draw.iter().sum();
        let mut probability = sample.probability();
        if draw[shard] > 0.0 {
            probability *= draw[shard] / total;
        }
        sample.set_drawn(probability, weights.iter().flatten().map(|w| w.size).sum());
    }
}

impl Drop for ShardedSampler {
    fn drop(&mut self) {
        self.refreshers.iter().for_each(|r| r.abort());
    }
}

enum Draw {
    Shard(usize),
    Wait,
    End,
    Fail(ClientError),
}

/// Whether a sample stream's error means its server went away (after the retries of its
/// [`ServerSampler`]), rather than that the request was wrong: the sampler then draws from the
/// other shards. Other errors fail the sampler, as they fail a sampler of one server.
fn is_lost_shard(e: &ClientError) -> bool {
    matches!(
        e.code,
        Code::Unavailable
            | Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Aborted
    )
}

/// Asks shard `index` for its table's weight every [`REFRESH_EVERY`], for as long as its
/// sampler lives.
async fn refresh(
    client: Client,
    table: String,
    index: usize,
    states: Arc<watch::Sender<Vec<ShardState>>>,
) {
    loop {
        let state = match client.server_info(Some(REFRESH_TIMEOUT)).await {
            Ok(infos) => ShardState::Known(ShardWeight::of(&infos, &table)),
            Err(e) => ShardState::Missing(e),
        };
        states.send_modify(|s| s[index] = state);
        tokio::time::sleep(REFRESH_EVERY).await;
    }
}
