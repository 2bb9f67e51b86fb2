//! Several servers used as one (`reverb.ShardedClient`): item keys that name the shard that
//! holds them, and the weights a client draws shards by so that samples follow the global
//! distribution (the sharded sampler itself is in `sampler.rs`).

use crate::sampler::{SamplerOptions, ServerSampler};
use crate::{runtime, Client, ClientError, PlannedSample, Result};
use reverb_proto::key_distribution_options::Distribution;
use reverb_proto::TableInfo;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tonic::Code;

/// The most shards a sharded client spreads its writes over (the shard index is 6 bits of
/// the item key).
pub const MAX_SHARDS: usize = 64;

/// The top 6 bits of an item key written through a sharded client; the next 6 bits are the
/// shard index and the low 52 bits random. A key without this mark (e.g. written by a plain
/// client) is of unknown origin.
const MARK: u64 = 0b10_1101;

/// `random` with its top 12 bits replaced by the mark and `shard`.
pub fn tag_key(random: u64, shard: u8) -> u64 {
    debug_assert!((shard as usize) < MAX_SHARDS);
    (MARK << 58) | ((shard as u64 & 0x3f) << 52) | (random & ((1 << 52) - 1))
}

/// The shard a key written through a sharded client names; `None` for other keys.
pub fn key_shard(key: u64) -> Option<u8> {
    (key >> 58 == MARK).then_some(((key >> 52) & 0x3f) as u8)
}

/// What a sharded client knows of one shard's table: its size and the total weight its
/// sampler draws by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardWeight {
    /// Items in the table.
    pub size: i64,
    /// The sum of the sampler's item weights (an item's probability on its shard is its
    /// weight over this). Servers that do not report it (the reference's) count as uniform:
    /// their size.
    pub total_weight: f64,
    /// Whether its rate limiter refuses a sample now (it waits for inserts).
    pub sampling_blocked: bool,
    /// Whether sampling deletes items (`max_times_sampled`, e.g. queues).
    pub sampling_deletes: bool,
}

impl ShardWeight {
    /// The weight of `table` as a server's `ServerInfo` describes it; `None` if it has no
    /// such table.
    pub fn of(infos: &[TableInfo], table: &str) -> Option<Self> {
        let info = infos.iter().find(|i| i.name == table)?;
        // The limiter's test for one more sample (its counters are in `rate_limiter_info`).
        let sampling_blocked = info.rate_limiter_info.as_ref().is_some_and(|l| {
            let inserts = l.insert_stats.as_ref().map_or(0, |s| s.completed) as f64;
            let samples = l.sample_stats.as_ref().map_or(0, |s| s.completed) as f64;
            info.current_size < l.min_size_to_sample
                || inserts * l.samples_per_insert - samples - 1.0 < l.min_diff
        });
        Some(Self {
            size: info.current_size,
            total_weight: info
                .sampler_total_weight
                .unwrap_or(info.current_size as f64),
            sampling_blocked,
            sampling_deletes: info.max_times_sampled > 0,
        })
    }
}

/// Whether `info`'s sampler draws in a fixed order (FIFO, LIFO, heaps): across shards such
/// tables are drawn by size, and their order holds only within a shard.
pub fn is_ordered(info: &TableInfo) -> bool {
    matches!(
        info.sampler_options
            .as_ref()
            .and_then(|o| o.distribution.as_ref()),
        Some(Distribution::Fifo(_) | Distribution::Lifo(_) | Distribution::Heap(_))
    )
}

/// The weights shards are drawn by: their sampler totals, or, when every total is 0 (only
/// zero priorities, which the prioritized sampler then draws uniformly), their sizes.
/// Unknown shards (unreachable, or without the table) weigh 0.
pub fn draw_weights(shards: &[Option<ShardWeight>]) -> Vec<f64> {
    let totals: Vec<f64> = shards
        .iter()
        .map(|w| w.map_or(0.0, |w| w.total_weight.max(0.0)))
        .collect();
    if totals.iter().any(|&t| t > 0.0) {
        return totals;
    }
    shards
        .iter()
        .map(|w| w.map_or(0.0, |w| w.size.max(0) as f64))
        .collect()
}

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
/// every [`REFRESH_EVERY`]), so samples follow the distribution of one table holding every
/// shard's items. A drawn shard is waited for, except when its rate limiter blocks sampling
/// while other shards have samples ready (one writer blocked on that shard's inserts could
/// otherwise wait for this sampler for ever): the draw is then owed to it, and owed draws
/// are served first once it has samples again. Missing shards are not drawn until they
/// answer again. With `max_samples` on tables where sampling deletes items, the shards'
/// samplers share one budget, so no more than that are taken from the servers (the last
/// samples then come from the shards that still have requested ones, whatever their weight).
pub(crate) struct ShardedSampler {
    table: String,
    /// Options of each shard's sampler (`max_samples` is the shared budget instead).
    options: SamplerOptions,
    clients: Vec<Client>,
    samplers: Vec<Option<ServerSampler>>,
    /// Samples not yet requested from any shard (`max_samples`; i64::MAX without).
    budget: Arc<AtomicI64>,
    states: Arc<watch::Sender<Vec<ShardState>>>,
    changes: watch::Receiver<Vec<ShardState>>,
    refreshers: Vec<tokio::task::JoinHandle<()>>,
    /// Each shard's last known weight (for samples it sent before it went missing).
    last_weight: Vec<Option<ShardWeight>>,
    /// Draws owed to each shard (see above).
    owed: Vec<u32>,
    /// The shard the next sample comes from, once drawn (kept across calls that time out, so
    /// a slow shard is not drawn less often).
    chosen: Option<usize>,
    /// Samples a timed-out call received, returned by the next call.
    held: Vec<PlannedSample>,
    /// Samples still to return (`max_samples`).
    left: Option<u64>,
    ended: bool,
    failure: Option<ClientError>,
    /// When a sample last came (or the sampler started): with a rate-limiter timeout, the
    /// stream ends once no shard sent one for that long.
    last_sample: Instant,
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
            budget: Arc::new(AtomicI64::new(
                options.max_samples.map_or(i64::MAX, |m| m as i64),
            )),
            options: SamplerOptions {
                max_samples: None,
                // (Names one server of this process: each shard finds its own.)
                inproc_abi: None,
                ..options
            },
            samplers: clients.iter().map(|_| None).collect(),
            clients,
            states,
            changes,
            refreshers,
            last_weight: vec![None; n],
            owed: vec![0; n],
            chosen: None,
            held: Vec::new(),
            ended: false,
            failure: None,
            last_sample: Instant::now(),
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
    ) -> Result<Option<Vec<PlannedSample>>> {
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
            }
            let slice = if ready_only || owed.is_some() {
                Duration::ZERO
            } else {
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(PATIENCE)
            };
            let Some(sampler) = self.samplers[shard].as_mut() else {
                self.chosen = None; // (its sampler ended since it was drawn)
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
                // Its stream ended: the budget is spent, or its rate limiter blocked for the
                // rate-limiter timeout (the whole stream ends once no shard sent a sample for
                // that long; its sampler starts again when it is drawn next).
                Ok(Some(v)) if v.is_empty() => {
                    self.samplers[shard] = None;
                    self.chosen = None;
                    let spent = self.budget.load(Ordering::SeqCst) <= 0;
                    let timed_out = self
                        .options
                        .rate_limiter_timeout
                        .is_some_and(|t| self.last_sample.elapsed() >= t);
                    if (spent || timed_out) && !(0..self.clients.len()).any(|s| self.ready(s)) {
                        self.ended = true;
                    }
                }
                Ok(Some(mut v)) => {
                    let mut sample = v.pop().expect("one sample");
                    self.globalize(&mut sample, shard);
                    out.push(sample);
                    self.last_sample = Instant::now();
                    match owed {
                        Some(s) => self.owed[s] -= 1,
                        None => self.chosen = None,
                    }
                    self.left = self.left.map(|l| l - 1);
                }
                Err(e) if is_lost_shard(&e) => {
                    self.samplers[shard] = None;
                    self.chosen = None;
                    self.owed[shard] = 0;
                    self.states
                        .send_modify(|s| s[shard] = ShardState::Missing(e));
                }
                Err(e) => self.failure = Some(e),
            }
        }
        Ok(Some(out))
    }

    /// Whether shard `s`'s sampler has a sample ready.
    fn ready(&self, s: usize) -> bool {
        self.samplers[s]
            .as_ref()
            .is_some_and(ServerSampler::has_ready)
    }

    /// The drawn shard `shard` had no sample within [`PATIENCE`]: stop waiting for it if it
    /// went missing or emptied, or (owing it the draw) if its rate limiter blocks sampling
    /// while other shards have samples ready.
    fn reconsider(&mut self, shard: usize) {
        let others_ready = (0..self.clients.len()).any(|s| s != shard && self.ready(s));
        match self.changes.borrow()[shard] {
            ShardState::Missing(_) => self.chosen = None,
            ShardState::Known(Some(w)) if w.size == 0 => self.chosen = None,
            ShardState::Known(Some(w)) if w.sampling_blocked && others_ready => {
                self.chosen = None;
                self.owed[shard] = (self.owed[shard] + 1).min(MAX_OWED);
            }
            _ => {}
        }
    }

    /// Starts the sampler of every shard that has the table and has none (while the budget
    /// lasts). A shard's sampler is stopped only by its own stream's failure.
    fn start_samplers(&mut self, states: &[ShardState]) -> Result<()> {
        if self.budget.load(Ordering::SeqCst) <= 0 {
            return Ok(());
        }
        for (shard, state) in states.iter().enumerate() {
            let ShardState::Known(Some(weight)) = state else {
                continue;
            };
            if self.samplers[shard].is_none() {
                // Only where sampling deletes items does the shared budget bound what each
                // shard's sampler requests: elsewhere samples requested but never taken cost
                // nothing, and an unbounded prefetch keeps the draw's proportions to the end.
                let budget = if weight.sampling_deletes {
                    self.budget.clone()
                } else {
                    Arc::new(AtomicI64::new(i64::MAX))
                };
                self.samplers[shard] = Some(ServerSampler::with_budget(
                    self.clients[shard].clone(),
                    &self.table,
                    self.options.clone(),
                    budget,
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
                // (A shard without a sampler now has its budget spent.)
                ShardState::Known(w) if self.samplers[i].is_some() => *w,
                _ => None,
            })
            .collect();
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
        if self.budget.load(Ordering::SeqCst) <= 0 {
            // Every sample of the budget was requested: those still queued are taken as
            // owed draws; then the stream ends.
            return match (0..self.clients.len()).find(|&s| self.samplers[s].is_some()) {
                Some(s) => Draw::Shard(s),
                None => Draw::End,
            };
        }
        // Every shard that answered lacks the table: one that answered reports the server's
        // error through a sampler of its own.
        if states
            .iter()
            .all(|s| matches!(s, ShardState::Known(None) | ShardState::Missing(_)))
        {
            if let Some(i) = states
                .iter()
                .position(|s| matches!(s, ShardState::Known(None)))
            {
                if self.samplers[i].is_none() {
                    match ServerSampler::with_budget(
                        self.clients[i].clone(),
                        &self.table,
                        self.options.clone(),
                        self.budget.clone(),
                    ) {
                        Ok(sampler) => self.samplers[i] = Some(sampler),
                        Err(e) => return Draw::Fail(e),
                    }
                }
                return Draw::Shard(i);
            }
        }
        let missing: Vec<&ClientError> = states
            .iter()
            .filter_map(|s| match s {
                ShardState::Missing(e) => Some(e),
                _ => None,
            })
            .collect();
        if missing.len() == states.len() {
            // As a call to one server that cannot be reached: wait for one, then fail.
            let since = *self.all_missing_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= self.connect_wait {
                return Draw::Fail(ClientError::new(
                    Code::Unavailable,
                    format!(
                        "None of the {} servers of table '{}' can be reached ({})",
                        states.len(),
                        self.table,
                        missing[0].message
                    ),
                ));
            }
            return Draw::Wait;
        }
        self.all_missing_since = None;
        // Every table is empty: as one server's rate limiter, wait (at most its timeout).
        match self.options.rate_limiter_timeout {
            Some(t) if self.last_sample.elapsed() >= t => Draw::End,
            _ => Draw::Wait,
        }
    }

    /// Makes a shard's sample info global: its probability times the shard's share of the
    /// draw, and the table size summed over the shards (its own shard, if missing now, as it
    /// was last known).
    fn globalize(&self, sample: &mut PlannedSample, shard: usize) {
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
        if draw[shard] > 0.0 {
            sample.info.probability *= draw[shard] / total;
        }
        sample.info.table_size = weights.iter().flatten().map(|w| w.size).sum();
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn tagged_keys_name_their_shard(random: u64, shard in 0u8..64) {
            let key = tag_key(random, shard);
            prop_assert_eq!(key_shard(key), Some(shard));
            prop_assert_eq!(key & ((1 << 52) - 1), random & ((1 << 52) - 1));
        }

        #[test]
        fn only_marked_keys_name_a_shard(key: u64) {
            prop_assert_eq!(key_shard(key).is_some(), key >> 58 == MARK);
        }
    }

    #[test]
    fn weights_fall_back_to_sizes_when_every_total_is_zero() {
        let w = |size, total_weight| {
            Some(ShardWeight {
                size,
                total_weight,
                sampling_blocked: false,
                sampling_deletes: false,
            })
        };
        assert_eq!(draw_weights(&[w(3, 1.5), None, w(2, 0.0)]), [1.5, 0.0, 0.0]);
        assert_eq!(draw_weights(&[w(3, 0.0), None, w(2, 0.0)]), [3.0, 0.0, 2.0]);
        let info = TableInfo {
            name: "t".into(),
            current_size: 7,
            ..Default::default()
        };
        assert_eq!(
            ShardWeight::of(std::slice::from_ref(&info), "t"),
            Some(ShardWeight {
                size: 7,
                total_weight: 7.0,
                sampling_blocked: false,
                sampling_deletes: false,
            })
        );
        assert_eq!(ShardWeight::of(&[info], "u"), None);
    }

    #[test]
    fn clients_write_keys_that_name_their_shard_or_none() {
        let plain = Client::new("localhost:1").unwrap();
        let sharded = plain.clone().with_key_shard(Some(5)).unwrap();
        for _ in 0..10_000 {
            assert_eq!(key_shard(plain.new_item_key()), None);
            assert_eq!(key_shard(sharded.new_item_key()), Some(5));
        }
        assert!(plain.with_key_shard(Some(MAX_SHARDS)).is_err());
    }

    #[test]
    fn a_limiter_that_waits_for_inserts_blocks_sampling() {
        use reverb_proto::{RateLimiterCallStats, RateLimiterInfo};
        // SampleToInsertRatio(2, min_size 1, error_buffer 2): min_diff = 0.
        let info = |size, inserts, samples| TableInfo {
            name: "t".into(),
            current_size: size,
            max_times_sampled: 1,
            rate_limiter_info: Some(RateLimiterInfo {
                samples_per_insert: 2.0,
                min_diff: 0.0,
                max_diff: 4.0,
                min_size_to_sample: 1,
                insert_stats: Some(RateLimiterCallStats { completed: inserts }),
                sample_stats: Some(RateLimiterCallStats { completed: samples }),
            }),
            ..Default::default()
        };
        let blocked = |size, inserts, samples| {
            let weight = ShardWeight::of(&[info(size, inserts, samples)], "t").unwrap();
            assert!(weight.sampling_deletes);
            weight.sampling_blocked
        };
        assert!(blocked(0, 0, 0)); // below min_size
        assert!(!blocked(3, 3, 5)); // 3 * 2 - 5 - 1 >= 0
        assert!(blocked(3, 3, 6)); // one more would go below min_diff
    }
}
