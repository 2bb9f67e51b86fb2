//! Several servers used as one (`reverb.ShardedClient`): item keys that name the shard that
//! holds them, and the weights a client draws shards by so that samples follow the global
//! distribution (the sharded sampler itself is in `sampler.rs`).

use crate::sampler::{SamplerOptions, ServerSampler};
use crate::{runtime, Client, ClientError, PlannedSample, Result};
use reverb_proto::key_distribution_options::Distribution;
use reverb_proto::TableInfo;
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
}

impl ShardWeight {
    /// The weight of `table` as a server's `ServerInfo` describes it; `None` if it has no
    /// such table.
    pub fn of(infos: &[TableInfo], table: &str) -> Option<Self> {
        let info = infos.iter().find(|i| i.name == table)?;
        Some(Self {
            size: info.current_size,
            total_weight: info
                .sampler_total_weight
                .unwrap_or(info.current_size as f64),
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
/// How long a consumer waits for the shard it drew before checking that the shard is still
/// there, and before drawing again when other shards have samples ready.
const PATIENCE: Duration = Duration::from_millis(50);
/// How long a shard that kept a draw waiting that long is drawn only when it has a sample
/// ready.
const STALL: Duration = Duration::from_millis(200);

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

/// A sampler of several servers: one [`ServerSampler`] per shard, started when the shard is
/// first drawn; each sample comes from a shard drawn in proportion to its weight (refreshed
/// every [`REFRESH_EVERY`]), so samples follow the distribution of one table holding every
/// shard's items. Missing shards are skipped until they answer again.
pub(crate) struct ShardedSampler {
    table: String,
    /// Options of each shard's sampler (without `max_samples`: that counts here).
    options: SamplerOptions,
    clients: Vec<Client>,
    samplers: Vec<Option<ServerSampler>>,
    states: Arc<watch::Sender<Vec<ShardState>>>,
    changes: watch::Receiver<Vec<ShardState>>,
    refreshers: Vec<tokio::task::JoinHandle<()>>,
    /// The shard the next sample comes from, once drawn (kept across calls that time out, so
    /// a slow shard is not drawn less often).
    chosen: Option<usize>,
    /// Samples a timed-out call received, returned by the next call.
    held: Vec<PlannedSample>,
    /// Per shard: until when it is drawn only with a sample ready (see [`STALL`]).
    stalled: Vec<Option<Instant>>,
    /// Samples still to return (`max_samples`).
    left: Option<u64>,
    ended: bool,
    failure: Option<ClientError>,
    /// Since when no shard could be drawn (all missing, or all empty).
    stuck_since: Option<Instant>,
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
        let states_len = clients.len();
        let (states, changes) = watch::channel(vec![ShardState::Unknown; states_len]);
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
            chosen: None,
            held: Vec::new(),
            stalled: vec![None; states_len],
            ended: false,
            failure: None,
            stuck_since: None,
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

    /// Takes up to `n` samples (see [`crate::sampler::Sampler::next`]).
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
            let shard = match self.chosen {
                Some(s) => s,
                None => match self.draw() {
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
            self.chosen = Some(shard);
            let now = Instant::now();
            let slice = if ready_only {
                Duration::ZERO
            } else {
                deadline.saturating_duration_since(now).min(PATIENCE)
            };
            let Some(sampler) = self.samplers[shard].as_mut() else {
                self.chosen = None; // (it went missing since the draw)
                continue;
            };
            match sampler.take(1, slice, true).await {
                Ok(None) if ready_only => break,
                Ok(None) => {
                    // Still waiting for this shard: give up on it once it went missing or its
                    // table emptied; while other shards have samples ready, draw again (its
                    // rate limiter may be waiting for inserts that wait for those samples).
                    match self.changes.borrow()[shard] {
                        ShardState::Missing(_) => self.chosen = None,
                        ShardState::Known(Some(w)) if w.size == 0 => self.chosen = None,
                        _ => {}
                    }
                    if self.chosen.is_some() && self.any_ready() {
                        self.stalled[shard] = Some(Instant::now() + STALL);
                        self.chosen = None;
                    }
                    if Instant::now() >= deadline {
                        self.held = out;
                        return Ok(None);
                    }
                }
                // Its stream ended: its rate limiter blocked for the rate-limiter timeout. That
                // ends the whole stream unless other shards have samples (its sampler then
                // starts again when the shard is drawn next).
                Ok(Some(v)) if v.is_empty() => {
                    self.samplers[shard] = None;
                    self.chosen = None;
                    if !self.any_ready() {
                        self.ended = true;
                    }
                }
                Ok(Some(mut v)) => {
                    let mut sample = v.pop().expect("one sample");
                    self.globalize(&mut sample, shard);
                    out.push(sample);
                    self.chosen = None;
                    self.left = self.left.map(|l| l - 1);
                }
                Err(e) if is_lost_shard(&e) => {
                    self.samplers[shard] = None;
                    self.chosen = None;
                    self.states
                        .send_modify(|s| s[shard] = ShardState::Missing(e));
                }
                Err(e) => self.failure = Some(e),
            }
        }
        Ok(Some(out))
    }

    /// Whether some shard's sampler has a sample ready.
    fn any_ready(&self) -> bool {
        self.samplers.iter().flatten().any(ServerSampler::has_ready)
    }

    /// Starts the sampler of every shard that has the table and has none (each keeps its
    /// samples requested from then on); drops those of shards gone missing.
    fn start_samplers(&mut self, states: &[ShardState]) -> Result<()> {
        for (shard, state) in states.iter().enumerate() {
            match state {
                ShardState::Known(Some(_)) if self.samplers[shard].is_none() => {
                    self.samplers[shard] = Some(ServerSampler::new(
                        self.clients[shard].clone(),
                        &self.table,
                        self.options.clone(),
                    )?);
                }
                ShardState::Missing(_) => self.samplers[shard] = None,
                _ => {}
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
        let weights: Vec<Option<ShardWeight>> = states
            .iter()
            .map(|s| match s {
                ShardState::Known(w) => *w,
                _ => None,
            })
            .collect();
        let mut draw = draw_weights(&weights);
        // Shards that kept a draw waiting while others had samples are left out for a while,
        // unless they have one ready now (or every shard is left out).
        let now = Instant::now();
        let stalled: Vec<bool> = (0..draw.len())
            .map(|i| {
                self.stalled[i].is_some_and(|until| until > now)
                    && !self.samplers[i]
                        .as_ref()
                        .is_some_and(ServerSampler::has_ready)
            })
            .collect();
        if draw.iter().zip(&stalled).any(|(&w, &s)| w > 0.0 && !s) {
            for (w, s) in draw.iter_mut().zip(&stalled) {
                if *s {
                    *w = 0.0;
                }
            }
        }
        let total: f64 = draw.iter().sum();
        if total > 0.0 {
            self.stuck_since = None;
            let mut target = rand::random::<f64>() * total;
            for (i, &w) in draw.iter().enumerate() {
                if target < w {
                    return Draw::Shard(i);
                }
                target -= w;
            }
            return Draw::Shard(draw.iter().rposition(|&w| w > 0.0).expect("total > 0"));
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
                    match ServerSampler::new(
                        self.clients[i].clone(),
                        &self.table,
                        self.options.clone(),
                    ) {
                        Ok(sampler) => self.samplers[i] = Some(sampler),
                        Err(e) => return Draw::Fail(e),
                    }
                }
                return Draw::Shard(i);
            }
        }
        let since = *self.stuck_since.get_or_insert_with(Instant::now);
        let missing: Vec<&ClientError> = states
            .iter()
            .filter_map(|s| match s {
                ShardState::Missing(e) => Some(e),
                _ => None,
            })
            .collect();
        if missing.len() == states.len() && since.elapsed() >= self.connect_wait {
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
        // Every table is empty: as one server's rate limiter, wait (at most its timeout).
        match self.options.rate_limiter_timeout {
            Some(t) if since.elapsed() >= t => Draw::End,
            _ => Draw::Wait,
        }
    }

    /// Makes a shard's sample info global: its probability times the shard's share of the
    /// draw, and the table size summed over the shards.
    fn globalize(&self, sample: &mut PlannedSample, shard: usize) {
        let states = self.changes.borrow();
        let weights: Vec<Option<ShardWeight>> = states
            .iter()
            .map(|s| match s {
                ShardState::Known(w) => *w,
                _ => None,
            })
            .collect();
        let draw = draw_weights(&weights);
        let total: f64 = draw.iter().sum();
        if draw[shard] > 0.0 {
            sample.info.probability *= draw[shard] / total;
        }
        let mut size: i64 = weights.iter().flatten().map(|w| w.size).sum();
        if weights[shard].is_none() {
            // It went missing since: count it as it was when it sampled.
            size += sample.info.table_size;
        }
        sample.info.table_size = size;
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
        let w = |size, total_weight| Some(ShardWeight { size, total_weight });
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
                total_weight: 7.0
            })
        );
        assert_eq!(ShardWeight::of(&[info], "u"), None);
    }
}
