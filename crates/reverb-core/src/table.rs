//! A table: items with priorities, a sampler, a remover, a max size, `max_times_sampled` and a
//! rate limiter. Every operation is non-blocking and runs under one lock; callers that must wait
//! (the gRPC service) wait on [`Table::changed`], which fires after every state change.

use crate::chunk::ItemData;
use crate::journal::TableJournal;
use crate::keymap::KeyMap;
use crate::rate_limiter::{RateLimiter, RateLimiterConfig};
use crate::rows::Rows;
use crate::selectors::{prioritized_weight, Place, Selector, SelectorKind};
use crate::{invalid_arg, Result};
use bytes::Bytes;
use parking_lot::Mutex;
use rand::{rngs::StdRng, SeedableRng};
use reverb_proto::gather::Batch;
use reverb_proto::held::HeldSample;
use reverb_proto::{SampleInfo, TableInfo, TableWorkerTime};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Static settings of a table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableConfig {
    /// Unique name within a server.
    pub name: String,
    /// Chooses what `sample` returns.
    pub sampler: SelectorKind,
    /// Chooses what is evicted when the table is over `max_size`.
    pub remover: SelectorKind,
    /// Most items held at once.
    pub max_size: i64,
    /// Items are deleted after this many samples; `< 1` means never.
    pub max_times_sampled: i32,
    /// When inserts and samples may go ahead.
    pub rate_limiter: RateLimiterConfig,
    /// Serialized `tensorflow.StructuredValue`, opaque to the server.
    pub signature: Option<Bytes>,
}

/// One sampled item with the values it had when sampled.
#[derive(Debug, Clone)]
pub struct SampledItem {
    /// The item (shared; its chunks stay alive while this is held).
    pub item: Arc<ItemData>,
    /// The name of the table it was sampled from.
    pub table: Arc<str>,
    /// Priority at sampling time.
    pub priority: f64,
    /// Times sampled, counting this sample.
    pub times_sampled: i32,
    /// Probability the sampler had of picking it.
    pub probability: f64,
    /// Table size when sampled.
    pub table_size: i64,
}

impl SampledItem {
    /// The `SampleInfo` a sample carries on the wire.
    pub fn info(&self) -> SampleInfo {
        SampleInfo {
            item: Some(
                self.item
                    .to_proto(&self.table, self.priority, self.times_sampled),
            ),
            probability: self.probability,
            table_size: self.table_size,
            rate_limited: false,
        }
    }
}

impl From<SampledItem> for HeldSample {
    /// The sample held in place (what a client of this process, or a gather, reads).
    fn from(s: SampledItem) -> Self {
        HeldSample {
            item: s.item,
            table: s.table,
            priority: s.priority,
            times_sampled: s.times_sampled,
            probability: s.probability,
            table_size: s.table_size,
        }
    }
}

/// A batch drawn from a table: its items, or their rows as columns.
#[derive(Debug)]
pub enum Draw {
    /// The items, held.
    Items(Vec<SampledItem>),
    /// The items' rows as columns (see [`Table::try_sample_rows`]).
    Columns(Batch),
}

/// A [`SampledItem`]'s values other than the item and its table, as drawn.
#[derive(Debug, Clone, Copy)]
struct Drawn {
    priority: f64,
    times_sampled: i32,
    probability: f64,
    table_size: i64,
}

/// What `try_insert` did.
#[derive(Debug)]
pub enum InsertOutcome {
    /// The item is stored.
    Inserted,
    /// The key existed: only its priority changed.
    Updated,
    /// The rate limiter does not allow the insert yet; the item is handed back.
    Blocked(ItemData),
}

struct Entry {
    data: Arc<ItemData>,
    priority: f64,
    /// Insertion order (checkpoints save items in it so FIFO/LIFO/heap order rebuilds; the
    /// Fifo and Lifo selectors find the item by it).
    seq: u64,
    times_sampled: i32,
    /// The item's slot in the sampler ([`Place::slot`]; the remover keeps its own).
    slot: u32,
    /// The item's record in the table's [`Rows`] ([`NO_RECORD`]: none).
    record: u32,
}

/// [`Entry::record`] of an item whose rows are not kept.
const NO_RECORD: u32 = u32::MAX;

// What a table's index holds per item beside its key: keep it at 40 bytes (64-bit).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Entry>() == 40);

impl Entry {
    /// The item's place in the sampler (`which` 0) or the remover (1).
    fn place(&self, which: usize) -> Place {
        Place {
            key: self.data.key,
            seq: self.seq,
            slot: if which == 0 { self.slot } else { 0 },
        }
    }
}

/// A consistent copy of a table's contents, taken under the lock in O(items) pointer copies;
/// the chunk data itself is shared, not copied.
#[derive(Debug, Clone, Default)]
pub struct TableSnapshot {
    /// `(item, priority, times_sampled)` in insertion order.
    pub items: Vec<(Arc<ItemData>, f64, i32)>,
    /// Rate limiter counters `(inserts, samples, deletes)`.
    pub counters: (i64, i64, i64),
    /// Episodes whose last item was removed.
    pub num_deleted_episodes: i64,
    /// Items sampled at least once.
    pub num_unique_samples: i64,
}

struct State {
    items: KeyMap<Entry>,
    sampler: Box<dyn Selector>,
    remover: Box<dyn Selector>,
    limiter: RateLimiter,
    episode_refs: KeyMap<u64>,
    num_deleted_episodes: i64,
    num_unique_samples: i64,
    next_seq: u64,
    rng: StdRng,
    /// Where its changes are logged (a disk-backed server's tables).
    journal: Option<TableJournal>,
    /// The items' rows, when the table keeps them (see [`crate::rows`]).
    rows: KeptRows,
}

/// Whether a table keeps its items' rows ([`Rows`]; each item's record is in its entry).
enum KeptRows {
    /// Decided by the next item (the table is empty).
    Undecided,
    /// Kept, for every item.
    Kept(Rows),
    /// Not kept until the table is next empty: an item does not fit, or the table logs to a
    /// journal (its chunks may be on disk).
    Not,
}

/// A replay table. Share it as `Arc<Table>`.
pub struct Table {
    /// `config.name`, shared with every sample.
    name: Arc<str>,
    config: TableConfig,
    state: Mutex<State>,
    changed: Notify,
    waits: [Waits; 2],
}

/// Which calls wait on a table's rate limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiter {
    /// Inserts (the table is full or samples lag behind).
    Insert = 0,
    /// Samples (too few items, or inserts lag behind).
    Sample = 1,
}

/// How many calls of one kind wait on the rate limiter now, and how long they waited in all.
#[derive(Debug, Default)]
struct Waits {
    now: AtomicI64,
    total_ns: AtomicU64,
}

/// A call waiting on a table's rate limiter, counted until it is dropped.
pub struct Waiting<'a> {
    waits: &'a Waits,
    since: std::time::Instant,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.waits.now.fetch_sub(1, Ordering::Relaxed);
        let ns = self.since.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.waits.total_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Why a table's rate limiter blocks a kind of call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockReason {
    /// Samples wait for the table to hold `min_size_to_sample` items.
    TooFewItems,
    /// The sample-to-insert ratio (or a queue's size) holds the calls back.
    SampleToInsertRatio,
}

impl BlockReason {
    /// A short name (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TooFewItems => "too_few_items",
            Self::SampleToInsertRatio => "sample_to_insert_ratio",
        }
    }
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Table {
    /// Builds an empty table, checking its settings.
    pub fn new(config: TableConfig) -> Result<Self> {
        Self::with_rng(config, StdRng::from_os_rng())
    }

    /// Like [`Table::new`] with a seeded random generator (deterministic tests).
    pub fn with_seed(config: TableConfig, seed: u64) -> Result<Self> {
        Self::with_rng(config, StdRng::seed_from_u64(seed))
    }

    fn with_rng(config: TableConfig, rng: StdRng) -> Result<Self> {
        if config.name.is_empty() {
            return Err(invalid_arg!("Table name must not be empty"));
        }
        if config.max_size <= 0 {
            return Err(invalid_arg!(
                "max_size ({}) must be a positive integer",
                config.max_size
            ));
        }
        let state = State {
            items: KeyMap::new(),
            sampler: config.sampler.build()?,
            remover: config.remover.build_unslotted()?,
            limiter: RateLimiter::new(config.rate_limiter)?,
            episode_refs: KeyMap::new(),
            num_deleted_episodes: 0,
            num_unique_samples: 0,
            next_seq: 0,
            rng,
            journal: None,
            rows: KeptRows::Undecided,
        };
        Ok(Self {
            name: config.name.as_str().into(),
            config,
            state: Mutex::new(state),
            changed: Notify::new(),
            waits: Default::default(),
        })
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The static settings.
    pub fn config(&self) -> &TableConfig {
        &self.config
    }

    /// Counts a call of kind `who` as waiting on the rate limiter until the guard is dropped.
    pub fn waiting(&self, who: Waiter) -> Waiting<'_> {
        let waits = &self.waits[who as usize];
        waits.now.fetch_add(1, Ordering::Relaxed);
        Waiting {
            waits,
            since: std::time::Instant::now(),
        }
    }

    /// Calls of a kind waiting on the rate limiter now, and their total wait so far (ended
    /// waits only).
    pub fn waits(&self, who: Waiter) -> (i64, std::time::Duration) {
        let waits = &self.waits[who as usize];
        (
            waits.now.load(Ordering::Relaxed),
            std::time::Duration::from_nanos(waits.total_ns.load(Ordering::Relaxed)),
        )
    }

    /// Why the rate limiter would block one insert / one sample now (`None`: it would not).
    pub fn block_reasons(&self) -> (Option<BlockReason>, Option<BlockReason>) {
        let st = self.state.lock();
        let insert = (!st.limiter.can_insert(1)).then_some(BlockReason::SampleToInsertRatio);
        let sample = (!st.limiter.can_sample(1)).then(|| {
            if (st.items.len() as i64) < st.limiter.config().min_size_to_sample {
                BlockReason::TooFewItems
            } else {
                BlockReason::SampleToInsertRatio
            }
        });
        (insert, sample)
    }

    /// The rate limiter's counters: inserts, samples and deletes.
    pub fn counters(&self) -> (i64, i64, i64) {
        self.state.lock().limiter.counters()
    }

    /// Fires (`notify_waiters`) after every change that could unblock an insert or a sample.
    /// Register (`Notified::enable`) before calling `try_*`, then wait, to never miss a change.
    pub fn changed(&self) -> &Notify {
        &self.changed
    }

    /// Number of items stored.
    pub fn size(&self) -> usize {
        self.state.lock().items.len()
    }

    /// Whether `n` samples could be taken now (rate limiter only, like the reference).
    pub fn can_sample(&self, n: i64) -> bool {
        self.state.lock().limiter.can_sample(n)
    }

    /// Whether `n` items could be inserted now (rate limiter only).
    pub fn can_insert(&self, n: i64) -> bool {
        self.state.lock().limiter.can_insert(n)
    }

    /// Checks that `priority` is one this table's selectors take.
    pub fn check_priority(&self, priority: f64) -> Result<()> {
        if priority.is_nan() {
            return Err(invalid_arg!(
                "Priority NaN is not valid for table '{}': a priority must be a number",
                self.config.name
            ));
        }
        for kind in [self.config.sampler, self.config.remover] {
            if let SelectorKind::Prioritized { priority_exponent } = kind {
                prioritized_weight(priority, priority_exponent).map_err(|e| {
                    invalid_arg!(
                        "Priority {priority:?} is not valid for table '{}': {e}",
                        self.config.name
                    )
                })?;
            }
        }
        Ok(())
    }

    /// Inserts an item, or updates the priority of an existing key. Evicts with the remover
    /// after insertion when the table is over `max_size` (the new item may evict itself).
    pub fn try_insert(&self, item: ItemData, priority: f64) -> Result<InsertOutcome> {
        self.check_priority(priority)?;
        let mut guard = self.state.lock();
        let outcome = guard.insert(&self.config, item, priority, &now())?;
        drop(guard);
        if !matches!(outcome, InsertOutcome::Blocked(_)) {
            self.changed.notify_waiters();
        }
        Ok(outcome)
    }

    /// Inserts items from the front of `items`, each as [`Table::try_insert`] would, while
    /// the rate limiter allows, in one hold of the lock; returns how many it took (the
    /// others are left for a call once the table [`changed`](Table::changed)). Priorities
    /// must have passed [`Table::check_priority`]. An error stops it: the items taken before
    /// it stay inserted, the failing one is dropped.
    pub fn try_insert_many(&self, items: &mut VecDeque<(ItemData, f64)>) -> Result<usize> {
        let at = now();
        let mut taken = 0;
        let mut guard = self.state.lock();
        let mut warm = 0;
        let result = loop {
            if warm == 0 {
                warm = guard.warm(items, self.config.max_size);
            }
            warm = warm.saturating_sub(1);
            let Some((item, priority)) = items.pop_front() else {
                break Ok(());
            };
            match guard.insert(&self.config, item, priority, &at) {
                Ok(InsertOutcome::Blocked(item)) => {
                    items.push_front((item, priority));
                    break Ok(());
                }
                Ok(_) => taken += 1,
                Err(e) => break Err(e),
            }
        };
        drop(guard);
        if taken > 0 {
            self.changed.notify_waiters();
        }
        result.map(|()| taken)
    }

    /// Samples up to `max_items` items while the rate limiter allows, stopping early once the
    /// sampled chunks add up to `max_bytes` (`usize::MAX`: never, and chunks are not looked at). Returns an empty batch when nothing may be sampled.
    /// Items reaching `max_times_sampled` are deleted before the lock is released.
    pub fn try_sample(&self, max_items: usize, max_bytes: usize) -> Vec<SampledItem> {
        let max = self.config.max_times_sampled;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        // Two passes. The first draws and counts without taking a reference to the items (an
        // atomic write per item, past which no load may start), so the cache misses of
        // successive draws overlap, and prefetches the items' records; the second takes
        // them. With max_times_sampled, an item is taken as it is drawn (the first pass
        // may delete it).
        let mut drawn: Vec<(u64, Option<Arc<ItemData>>, Drawn)> = Vec::new();
        if max == 0 && max_bytes == usize::MAX && !st.sampler.is_empty() {
            // Nothing changes the table between draws: as many as the rate limiter allows
            // are drawn together (the selector's descents overlap), then counted.
            let keys = st.draw_allowed(max_items);
            for (key, probability) in keys {
                st.limiter.sample();
                let (item, values) = st.count_draw(key, probability);
                reverb_proto::prefetch(Arc::as_ptr(item));
                drawn.push((key, None, values));
            }
        } else {
            let mut bytes = 0usize;
            while drawn.len() < max_items && bytes < max_bytes && st.limiter.can_sample(1) {
                let Some((key, probability)) = st.sampler.sample(&mut st.rng) else {
                    break;
                };
                let (item, values) = st.count_draw(key, probability);
                if max_bytes != usize::MAX {
                    bytes += item.byte_size();
                }
                let item = (max > 0).then(|| item.clone());
                st.limiter.sample();
                drawn.push((key, item, values));
                if max > 0 && values.times_sampled >= max {
                    st.delete_item(key);
                }
            }
        }
        let out: Vec<SampledItem> = drawn
            .into_iter()
            .map(|(key, item, v)| {
                let item = item.unwrap_or_else(|| {
                    let entry = st.items.get(&key).expect("drawn above");
                    entry.data.clone()
                });
                self.sampled(item, v)
            })
            .collect();
        drop(guard);
        if !out.is_empty() {
            self.changed.notify_waiters();
        }
        out
    }

    /// The sample of `item`, drawn from this table with `values`.
    fn sampled(&self, item: Arc<ItemData>, values: Drawn) -> SampledItem {
        SampledItem {
            item,
            table: self.name.clone(),
            priority: values.priority,
            times_sampled: values.times_sampled,
            probability: values.probability,
            table_size: values.table_size,
        }
    }

    /// Samples as [`Table::try_sample`] does without a byte limit (the same draws, counts
    /// and values), the batch gathered from the rows the table keeps (see [`crate::rows`]) as
    /// columns shaped as [`reverb_proto::gather::gather`] shapes them; as items when a drawn
    /// item's rows do not fit the others' (the table then stops keeping rows). `None` when
    /// the table keeps no rows now, or deletes items as they are sampled
    /// (`max_times_sampled`): then sample with [`Table::try_sample`]. An empty batch of rows
    /// when nothing may be sampled.
    pub fn try_sample_rows(&self, max_items: usize) -> Option<Draw> {
        if self.config.max_times_sampled > 0 {
            return None;
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if !matches!(st.rows, KeptRows::Kept(_)) {
            return None;
        }
        let keys = st.draw_allowed(max_items);
        let n = keys.len();
        let draw = if st.read_rows(&keys) {
            let mut info = Vec::with_capacity(keys.len());
            let mut records = Vec::with_capacity(keys.len());
            for (key, probability) in keys {
                st.limiter.sample();
                let (entry, v) = st.count_entry_draw(key, probability);
                records.push(entry.record);
                info.push((
                    key,
                    v.probability,
                    v.table_size,
                    v.priority,
                    v.times_sampled,
                ));
            }
            let columns = match &st.rows {
                KeptRows::Kept(rows) if !info.is_empty() => rows.gather(&records),
                _ => Vec::new(),
            };
            Draw::Columns(Batch { info, columns })
        } else {
            let items = keys
                .into_iter()
                .map(|(key, probability)| {
                    st.limiter.sample();
                    let (item, v) = st.count_draw(key, probability);
                    self.sampled(item.clone(), v)
                })
                .collect();
            Draw::Items(items)
        };
        drop(guard);
        if n > 0 {
            self.changed.notify_waiters();
        }
        Some(draw)
    }

    /// Deletes `deletes`, then applies `updates`; keys not in the table are ignored. All
    /// priorities are checked first, so a bad one changes nothing.
    pub fn mutate_items(&self, updates: &[(u64, f64)], deletes: &[u64]) -> Result<()> {
        for &(_, p) in updates {
            self.check_priority(p)?;
        }
        let mut guard = self.state.lock();
        let st = &mut *guard;
        for key in deletes {
            if st.items.contains_key(key) {
                st.delete_item(*key);
            }
        }
        // The keys' entries looked up first, with loads only, so that their cache misses
        // overlap (the loop below writes to each entry it finds).
        for &(key, _) in updates {
            std::hint::black_box(st.items.get(&key).is_some());
        }
        let mut places = (Vec::with_capacity(updates.len()), Vec::new());
        for &(key, priority) in updates {
            if let Some(entry) = st.items.get_mut(&key) {
                entry.priority = priority;
                places.0.push((entry.place(0), priority));
                places.1.push((entry.place(1), priority));
                if let Some(journal) = &st.journal {
                    journal.priority(key, priority);
                }
            }
        }
        st.sampler.update_many(&places.0)?;
        st.remover.update_many(&places.1)?;
        drop(guard);
        self.changed.notify_waiters();
        Ok(())
    }

    /// Removes every item and zeroes the counters (rate limiter, deleted episodes, unique samples).
    pub fn reset(&self) {
        let mut st = self.state.lock();
        st.items.clear();
        st.sampler.clear();
        st.remover.clear();
        st.limiter.reset();
        st.episode_refs.clear();
        st.num_deleted_episodes = 0;
        st.num_unique_samples = 0;
        st.rows = KeptRows::Undecided;
        if let Some(journal) = &mut st.journal {
            journal.reset();
        }
        drop(st);
        self.changed.notify_waiters();
    }

    /// Logs every later change of the table to `journal` (a disk-backed server's; None
    /// stops logging).
    pub(crate) fn set_journal(&self, journal: Option<TableJournal>) {
        let mut st = self.state.lock();
        st.rows = match journal {
            Some(_) => KeptRows::Not,
            None if st.items.is_empty() => KeptRows::Undecided,
            None => std::mem::replace(&mut st.rows, KeptRows::Not),
        };
        st.journal = journal;
    }

    /// Logs the counters to the table's journal if it has one and they changed.
    pub(crate) fn log_counters(&self) {
        let mut guard = self.state.lock();
        let st = &mut *guard;
        if let Some(journal) = &mut st.journal {
            let (inserts, samples, deletes) = st.limiter.counters();
            journal.counters([
                inserts,
                samples,
                deletes,
                st.num_deleted_episodes,
                st.num_unique_samples,
            ]);
        }
    }

    /// The `TableInfo` reported by `ServerInfo`.
    pub fn info(&self) -> TableInfo {
        let st = self.state.lock();
        TableInfo {
            name: self.config.name.clone(),
            sampler_options: Some(self.config.sampler.options()),
            remover_options: Some(self.config.remover.options()),
            max_size: self.config.max_size,
            max_times_sampled: self.config.max_times_sampled,
            rate_limiter_info: Some(st.limiter.info()),
            signature: self.config.signature.clone().unwrap_or_default(),
            current_size: st.items.len() as i64,
            num_episodes: st.episode_refs.len() as i64,
            num_deleted_episodes: st.num_deleted_episodes,
            num_unique_samples: st.num_unique_samples,
            table_worker_time: Some(TableWorkerTime::default()),
            sampler_total_weight: Some(st.sampler.total_weight()),
        }
    }

    /// A consistent copy of the contents (items in insertion order and counters). The lock is
    /// held only while item handles are copied; sorting happens after.
    pub fn snapshot(&self) -> TableSnapshot {
        let st = self.state.lock();
        let mut items: Vec<(u64, Arc<ItemData>, f64, i32)> = st
            .items
            .values()
            .map(|e| (e.seq, e.data.clone(), e.priority, e.times_sampled))
            .collect();
        let snapshot = TableSnapshot {
            items: Vec::new(),
            counters: st.limiter.counters(),
            num_deleted_episodes: st.num_deleted_episodes,
            num_unique_samples: st.num_unique_samples,
        };
        drop(st);
        items.sort_unstable_by_key(|e| e.0);
        TableSnapshot {
            items: items.into_iter().map(|(_, d, p, t)| (d, p, t)).collect(),
            ..snapshot
        }
    }

    /// Checks that [`Table::restore`] would take `snapshot`: every priority one this table's
    /// selectors take, no key twice.
    pub fn check_snapshot(&self, snapshot: &TableSnapshot) -> Result<()> {
        let mut keys = std::collections::HashSet::with_capacity(snapshot.items.len());
        for (item, priority, _) in &snapshot.items {
            self.check_priority(*priority)?;
            if !keys.insert(item.key) {
                return Err(invalid_arg!("Checkpoint holds item {} twice", item.key));
            }
        }
        Ok(())
    }

    /// Replaces the contents with a snapshot (checkpoint load): items are added in order
    /// without consulting the rate limiter, then the counters are restored. Items beyond this
    /// table's `max_size` are evicted by its remover (counted as deletes). Returns how many
    /// were evicted.
    pub fn restore(&self, snapshot: TableSnapshot) -> Result<usize> {
        // Check everything first: a bad checkpoint must not leave a half-loaded table.
        self.check_snapshot(&snapshot)?;
        let mut guard = self.state.lock();
        let st = &mut *guard;
        st.items.clear();
        st.sampler.clear();
        st.remover.clear();
        st.episode_refs.clear();
        st.rows = KeptRows::Undecided;
        for (item, priority, times_sampled) in snapshot.items {
            let item = Arc::try_unwrap(item).unwrap_or_else(|shared| (*shared).clone());
            st.add_item(item, priority, times_sampled)
                .expect("checked above");
        }
        let (inserts, samples, deletes) = snapshot.counters;
        st.limiter.set_counters(inserts, samples, deletes);
        st.num_deleted_episodes = snapshot.num_deleted_episodes;
        st.num_unique_samples = snapshot.num_unique_samples;
        let mut evicted = 0;
        while st.items.len() as i64 > self.config.max_size {
            let Some((victim, _)) = st.remover.sample(&mut st.rng) else {
                break;
            };
            st.delete_item(victim);
            evicted += 1;
        }
        drop(guard);
        self.changed.notify_waiters();
        Ok(evicted)
    }

    /// The stored item with `key`, with its priority and times sampled.
    pub fn get(&self, key: u64) -> Option<(Arc<ItemData>, f64, i32)> {
        let st = self.state.lock();
        st.items
            .get(&key)
            .map(|e| (e.data.clone(), e.priority, e.times_sampled))
    }
}

impl State {
    /// Stores a new item (the caller has checked the key is new and the limiter allows it).
    /// [`Table::try_insert`] under the lock, `at` being now.
    fn insert(
        &mut self,
        config: &TableConfig,
        mut item: ItemData,
        priority: f64,
        at: &prost_types::Timestamp,
    ) -> Result<InsertOutcome> {
        if let Some(entry) = self.items.get_mut(&item.key) {
            self.sampler.update(entry.place(0), priority)?;
            self.remover.update(entry.place(1), priority)?;
            entry.priority = priority;
            if let Some(journal) = &self.journal {
                journal.priority(item.key, priority);
            }
            return Ok(InsertOutcome::Updated);
        }
        if !self.limiter.can_insert(1) {
            return Ok(InsertOutcome::Blocked(item));
        }
        // As the reference: the time the table stored it, whatever the writer sent.
        item.set_inserted_at(at);
        let key = item.key;
        self.add_item(item, priority, 0)?;
        if let Some(journal) = &self.journal {
            journal.inserted(&self.items.get(&key).expect("just added").data, priority);
        }
        self.limiter.insert();
        if self.items.len() as i64 > config.max_size {
            if let Some((victim, _)) = self.remover.sample(&mut self.rng) {
                self.delete_item(victim);
            }
        }
        Ok(InsertOutcome::Inserted)
    }

    /// Loads what inserting the next of `items` will touch, all at once so that their cache
    /// misses overlap instead of coming one after another: each new key's place in the item
    /// map and, when the table is full, the records of the items a Fifo remover deletes to
    /// make room, and their chunks. Returns how many items it looked ahead.
    fn warm(&self, items: &VecDeque<(ItemData, f64)>, max_size: i64) -> usize {
        const AHEAD: usize = 64;
        let ahead = items.len().min(AHEAD);
        for (item, _) in items.iter().take(ahead) {
            std::hint::black_box(self.items.get(&item.key).is_some());
        }
        let over = (self.items.len() + ahead).saturating_sub(max_size.max(0) as usize);
        if over > 0 {
            let mut victims = Vec::with_capacity(over);
            self.remover.upcoming(over.min(ahead), &mut victims);
            for key in victims {
                if let Some(entry) = self.items.get(&key) {
                    for chunk in entry.data.chunks() {
                        reverb_proto::prefetch(Arc::as_ptr(chunk));
                    }
                }
            }
        }
        ahead
    }

    fn add_item(&mut self, item: ItemData, priority: f64, times_sampled: i32) -> Result<()> {
        let key = item.key;
        let seq = self.next_seq;
        let sampler_slot = self.sampler.insert(key, seq, priority)?;
        if let Err(e) = self.remover.insert(key, seq, priority) {
            let moved = self.sampler.delete(Place {
                key,
                seq,
                slot: sampler_slot,
            });
            debug_assert!(moved.is_none(), "the newest key moves no other");
            return Err(e);
        }
        self.next_seq += 1;
        for episode in episodes(&item) {
            *self.episode_refs.get_or_insert_with(episode, || 0) += 1;
        }
        let record = self.keep_rows(&item);
        self.items.insert(
            key,
            Entry {
                data: Arc::new(item),
                priority,
                seq,
                times_sampled,
                slot: sampler_slot,
                record,
            },
        );
        Ok(())
    }

    /// Draws as many keys as the rate limiter allows, up to `max_items`, together (the
    /// selector's descents overlap); nothing is counted yet. (`can_sample(n)`: whether n more
    /// samples may be drawn, as n single checks with a sample counted after each.)
    fn draw_allowed(&mut self, max_items: usize) -> Vec<(u64, f64)> {
        let mut n = 0;
        while n < max_items && self.limiter.can_sample(n as i64 + 1) {
            n += 1;
        }
        let mut keys = Vec::with_capacity(n);
        self.sampler.sample_many(&mut self.rng, n, &mut keys);
        debug_assert!(
            keys.len() == n || self.sampler.is_empty(),
            "a selector with keys always draws"
        );
        keys
    }

    /// The record of `item`, about to be added: the first item of an empty table decides
    /// whether the table keeps rows, and takes the first record; the others' rows are read
    /// when they are first drawn ([`State::read_rows`]), so that inserts do not pay for them.
    fn keep_rows(&mut self, item: &ItemData) -> u32 {
        if let KeptRows::Undecided = self.rows {
            let may = self.journal.is_none() && self.items.is_empty();
            match may.then(|| Rows::new(item)).flatten() {
                Some(rows) => {
                    self.rows = KeptRows::Kept(rows);
                    return 0;
                }
                None => self.rows = KeptRows::Not,
            }
        }
        NO_RECORD
    }

    /// Reads the rows of the items of `keys` not read yet into records; false (the table
    /// then keeps no rows) when one does not fit the others.
    fn read_rows(&mut self, keys: &[(u64, f64)]) -> bool {
        let KeptRows::Kept(rows) = &mut self.rows else {
            return false;
        };
        for (key, _) in keys {
            let entry = self.items.get_mut(key).expect("selector and items agree");
            if entry.record == NO_RECORD {
                match rows.push(&entry.data) {
                    Some(record) => entry.record = record,
                    None => {
                        self.rows = KeptRows::Not;
                        return false;
                    }
                }
            }
        }
        true
    }

    /// Counts a draw of `key` (its times sampled, the table's unique samples): its item and
    /// what its sample reports.
    fn count_draw(&mut self, key: u64, probability: f64) -> (&Arc<ItemData>, Drawn) {
        let (entry, drawn) = self.count_entry_draw(key, probability);
        (&entry.data, drawn)
    }

    /// [`State::count_draw`], giving the item's entry.
    fn count_entry_draw(&mut self, key: u64, probability: f64) -> (&Entry, Drawn) {
        let table_size = self.items.len() as i64;
        let entry = self.items.get_mut(&key).expect("selector and items agree");
        entry.times_sampled += 1;
        if entry.times_sampled == 1 {
            self.num_unique_samples += 1;
        }
        let values = Drawn {
            priority: entry.priority,
            times_sampled: entry.times_sampled,
            probability,
            table_size,
        };
        (entry, values)
    }

    fn delete_item(&mut self, key: u64) {
        let Some(entry) = self.items.remove(&key) else {
            return;
        };
        if let Some((moved, slot)) = self.sampler.delete(entry.place(0)) {
            self.items
                .get_mut(&moved)
                .expect("selectors and items agree")
                .slot = slot;
        }
        match &mut self.rows {
            _ if self.items.is_empty() => self.rows = KeptRows::Undecided,
            KeptRows::Kept(rows) if entry.record != NO_RECORD => rows.remove(entry.record),
            _ => {}
        }
        let moved = self.remover.delete(entry.place(1));
        debug_assert!(moved.is_none(), "a remover keeps its own slots");
        self.limiter.delete();
        if let Some(journal) = &self.journal {
            journal.deleted(key);
        }
        for episode in episodes(&entry.data) {
            if let Some(refs) = self.episode_refs.get_mut(&episode) {
                *refs -= 1;
                if *refs == 0 {
                    self.episode_refs.remove(&episode);
                    self.num_deleted_episodes += 1;
                }
            }
        }
    }
}

/// The episodes of an item's chunks, each run of chunks of one episode counted once (an
/// item's chunks are mostly of one episode: one count instead of one per column).
fn episodes(item: &ItemData) -> impl Iterator<Item = u64> + '_ {
    let chunks = item.chunks();
    chunks
        .iter()
        .enumerate()
        .filter(move |&(i, c)| i == 0 || chunks[i - 1].episode_id() != c.episode_id())
        .map(|(_, c)| c.episode_id())
}

fn now() -> prost_types::Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}
