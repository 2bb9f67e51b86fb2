//! Item selectors: which key a table samples or removes next.
//!
//! | selector | cost | probability returned |
//! |---|---|---|
//! | Uniform | O(1) | `1/n` |
//! | Prioritized(α) | O(log n), sum tree | `p^α / Σ p^α` (`0^α = 0`; all-zero → uniform) |
//! | Fifo / Lifo | O(1), deletes inside O(log n) | 1.0 |
//! | MinHeap / MaxHeap | O(log n); ties → least recently inserted/updated | 1.0 |

use crate::keymap::KeyMap;
use crate::{invalid_arg, Result};
use rand::{rngs::StdRng, Rng};
use reverb_proto::key_distribution_options::{Distribution, Heap, Prioritized};
use reverb_proto::KeyDistributionOptions;
use std::collections::{BTreeMap, VecDeque};

/// Which selector to build, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SelectorKind {
    /// Uniform over all keys.
    Uniform,
    /// Proportional to `priority ^ priority_exponent`.
    Prioritized {
        /// The exponent α.
        priority_exponent: f64,
    },
    /// Oldest inserted first.
    Fifo,
    /// Newest inserted first.
    Lifo,
    /// Lowest priority first.
    MinHeap,
    /// Highest priority first.
    MaxHeap,
}

impl SelectorKind {
    /// Builds the selector, for a table that keeps each key's slot ([`Place::slot`]).
    pub fn build(self) -> Result<Box<dyn Selector>> {
        Ok(match self {
            SelectorKind::Uniform => Box::new(Uniform::default()),
            SelectorKind::Prioritized { priority_exponent } => {
                if priority_exponent.is_nan()
                    || priority_exponent < 0.0
                    || priority_exponent.is_infinite()
                {
                    return Err(invalid_arg!(
                        "priority_exponent must be a finite number >= 0, got {priority_exponent}"
                    ));
                }
                Box::new(PrioritizedSelector::new(priority_exponent))
            }
            SelectorKind::Fifo => Box::new(Ordered::new(false)),
            SelectorKind::Lifo => Box::new(Ordered::new(true)),
            SelectorKind::MinHeap => Box::new(HeapSelector::new(true)),
            SelectorKind::MaxHeap => Box::new(HeapSelector::new(false)),
        })
    }

    /// Builds the selector for a table that keeps no slot for it (a table keeps one per item,
    /// for its sampler): one that finds keys by slot then keeps its own index of them.
    pub fn build_unslotted(self) -> Result<Box<dyn Selector>> {
        let selector = self.build()?;
        Ok(match self {
            SelectorKind::Uniform | SelectorKind::Prioritized { .. } => Box::new(Indexed {
                inner: selector,
                slots: KeyMap::new(),
            }),
            _ => selector,
        })
    }

    /// The wire description (`KeyDistributionOptions`).
    pub fn options(self) -> KeyDistributionOptions {
        let (distribution, is_deterministic) = match self {
            SelectorKind::Uniform => (Distribution::Uniform(true), false),
            SelectorKind::Prioritized { priority_exponent } => (
                Distribution::Prioritized(Prioritized { priority_exponent }),
                false,
            ),
            SelectorKind::Fifo => (Distribution::Fifo(true), true),
            SelectorKind::Lifo => (Distribution::Lifo(true), true),
            SelectorKind::MinHeap => (Distribution::Heap(Heap { min_heap: true }), true),
            SelectorKind::MaxHeap => (Distribution::Heap(Heap { min_heap: false }), true),
        };
        KeyDistributionOptions {
            distribution: Some(distribution),
            is_deterministic,
        }
    }

    /// Reads a wire description back.
    pub fn from_options(options: &KeyDistributionOptions) -> Result<Self> {
        Ok(match options.distribution {
            Some(Distribution::Uniform(_)) => SelectorKind::Uniform,
            Some(Distribution::Prioritized(p)) => SelectorKind::Prioritized {
                priority_exponent: p.priority_exponent,
            },
            Some(Distribution::Fifo(_)) => SelectorKind::Fifo,
            Some(Distribution::Lifo(_)) => SelectorKind::Lifo,
            Some(Distribution::Heap(Heap { min_heap: true })) => SelectorKind::MinHeap,
            Some(Distribution::Heap(Heap { min_heap: false })) => SelectorKind::MaxHeap,
            None => {
                return Err(invalid_arg!(
                    "KeyDistributionOptions has no distribution set"
                ))
            }
        })
    }
}

/// Where a table's key sits in a selector: what the table keeps with the key's entry and
/// hands back to [`Selector::update`] and [`Selector::delete`], so that the selectors of a
/// table need no index of their own (one hash index per table, the table's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The key.
    pub key: u64,
    /// The table's sequence number for the key (increasing in insertion order, below 2^63).
    pub seq: u64,
    /// What [`Selector::insert`] returned for the key, or the last move it reported.
    pub slot: u32,
}

/// Keys with priorities that can pick one key. Never called concurrently. The table owns the
/// keys: it calls `insert` only with new keys and `update`/`delete` only with present ones,
/// at their current [`Place`].
pub trait Selector: Send {
    /// Adds a new key whose sequence number is `seq`; returns its slot. Errs on a priority
    /// the selector does not take (and then holds no trace of the key).
    fn insert(&mut self, key: u64, seq: u64, priority: f64) -> Result<u32>;
    /// Changes the priority of the key at `at`.
    fn update(&mut self, at: Place, priority: f64) -> Result<()>;
    /// Removes the key at `at`. Returns another key whose slot this changed, with its new
    /// slot (for the table to record).
    fn delete(&mut self, at: Place) -> Option<(u64, u32)>;
    /// Picks a key and the probability it had of being picked; `None` when empty.
    fn sample(&mut self, rng: &mut StdRng) -> Option<(u64, f64)>;
    /// Removes every key.
    fn clear(&mut self);
    /// Number of keys.
    fn len(&self) -> usize;
    /// The sum of the weights keys are picked by (a key's probability is its weight over
    /// it): 1 per key, but for the prioritized selector.
    fn total_weight(&self) -> f64 {
        self.len() as f64
    }
    /// Whether there are no keys.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The slot of the next key of a selector holding `len` keys in slots `0..len`.
fn next_slot(len: usize) -> Result<u32> {
    u32::try_from(len).map_err(|_| invalid_arg!("a selector holds at most {} keys", u32::MAX))
}

/// Uniform: a dense key vector (a key's slot is its position); swap-remove keeps every
/// operation O(1).
#[derive(Default)]
pub struct Uniform {
    keys: Vec<u64>,
}

impl Selector for Uniform {
    fn insert(&mut self, key: u64, _seq: u64, _priority: f64) -> Result<u32> {
        let slot = next_slot(self.keys.len())?;
        self.keys.push(key);
        Ok(slot)
    }
    fn update(&mut self, _at: Place, _priority: f64) -> Result<()> {
        Ok(())
    }
    fn delete(&mut self, at: Place) -> Option<(u64, u32)> {
        let slot = at.slot as usize;
        debug_assert_eq!(self.keys[slot], at.key);
        self.keys.swap_remove(slot);
        self.keys.get(slot).map(|&moved| (moved, at.slot))
    }
    fn sample(&mut self, rng: &mut StdRng) -> Option<(u64, f64)> {
        if self.keys.is_empty() {
            return None;
        }
        let key = self.keys[rng.random_range(0..self.keys.len())];
        Some((key, 1.0 / self.keys.len() as f64))
    }
    fn clear(&mut self) {
        self.keys = Vec::new();
    }
    fn len(&self) -> usize {
        self.keys.len()
    }
}

/// A selector that finds keys by slot, with its own index of the slots (see
/// [`SelectorKind::build_unslotted`]): it ignores the slot of the places it is given and
/// reports no moves.
struct Indexed {
    inner: Box<dyn Selector>,
    slots: KeyMap<u32>,
}

impl Indexed {
    fn place(&self, at: Place) -> Place {
        let slot = *self
            .slots
            .get(&at.key)
            .expect("the table passes present keys");
        Place { slot, ..at }
    }
}

impl Selector for Indexed {
    fn insert(&mut self, key: u64, seq: u64, priority: f64) -> Result<u32> {
        let slot = self.inner.insert(key, seq, priority)?;
        self.slots.insert(key, slot);
        Ok(0)
    }
    fn update(&mut self, at: Place, priority: f64) -> Result<()> {
        self.inner.update(self.place(at), priority)
    }
    fn delete(&mut self, at: Place) -> Option<(u64, u32)> {
        let at = self.place(at);
        self.slots.remove(&at.key);
        if let Some((moved, slot)) = self.inner.delete(at) {
            self.slots.insert(moved, slot);
        }
        None
    }
    fn sample(&mut self, rng: &mut StdRng) -> Option<(u64, f64)> {
        self.inner.sample(rng)
    }
    fn clear(&mut self) {
        self.inner.clear();
        self.slots.clear();
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn total_weight(&self) -> f64 {
        self.inner.total_weight()
    }
}

/// Leaves of one block of the prioritized sum tree. A table's first block starts small and
/// doubles up to this; past it the table adds blocks, so growing never copies more than one
/// block (a single tree of 16M leaves took 0.4 s to double with the table's lock held).
const BLOCK: usize = 1 << 16;

/// Largest weight (`priority ^ exponent`) a prioritized selector takes: the sum of 10^10
/// such weights is still finite, so the sum tree never overflows to infinity (which would
/// make every probability NaN).
pub const MAX_WEIGHT: f64 = 1e298;

/// The weight of `priority` under a prioritized selector with `exponent`, or an error when
/// the priority is not a finite number >= 0 or its weight is too large to sum.
pub fn prioritized_weight(priority: f64, exponent: f64) -> Result<f64> {
    if priority.is_nan() || priority < 0.0 || priority.is_infinite() {
        return Err(invalid_arg!(
            "priority must be a finite number >= 0, got {priority:?}"
        ));
    }
    // 0^α = 0 even for α = 0, so an item with priority 0 is never sampled.
    if priority == 0.0 {
        return Ok(0.0);
    }
    let weight = priority.powf(exponent);
    if weight > MAX_WEIGHT {
        return Err(invalid_arg!(
            "priority {priority:?} to the power of the priority_exponent {exponent:?} is {weight:?}, \
             more than the {MAX_WEIGHT:e} a prioritized selector can sum"
        ));
    }
    Ok(weight)
}

/// Prioritized: dense slots whose weights sit in sum trees, one per block of `BLOCK` slots,
/// under a small sum tree of the blocks' totals. Every internal node is recomputed as the sum
/// of its children on update, so floating-point drift never accumulates.
pub struct PrioritizedSelector {
    exponent: f64,
    /// Each block's tree: `block[capacity + i]` holds the weight of the block's slot `i`,
    /// `block[j] = block[2j] + block[2j+1]`, `block[1]` the block's total.
    blocks: Vec<Vec<f64>>,
    /// Leaves per block (`BLOCK` once there are two blocks).
    capacity: usize,
    /// The same over the blocks' totals: `top[top_capacity + b]` is block `b`'s total.
    top: Vec<f64>,
    top_capacity: usize,
    /// The key in each slot.
    keys: Vec<u64>,
}

impl PrioritizedSelector {
    fn new(exponent: f64) -> Self {
        let capacity = 1024;
        Self {
            exponent,
            blocks: vec![vec![0.0; 2 * capacity]],
            capacity,
            top: vec![0.0; 2],
            top_capacity: 1,
            keys: Vec::new(),
        }
    }

    fn weight(&self, priority: f64) -> Result<f64> {
        prioritized_weight(priority, self.exponent)
    }

    /// The weight of `slot`.
    fn get(&self, slot: usize) -> f64 {
        self.blocks[slot / self.capacity][self.capacity + slot % self.capacity]
    }

    fn set(&mut self, slot: usize, weight: f64) {
        let b = slot / self.capacity;
        let block = &mut self.blocks[b];
        set_leaf(block, self.capacity, slot % self.capacity, weight);
        set_leaf(&mut self.top, self.top_capacity, b, block[1]);
    }

    /// Room for one more slot: the one block doubles up to `BLOCK` leaves, then blocks are
    /// added (and the top tree doubles when they fill it).
    fn grow(&mut self) {
        if self.blocks.len() == 1 && self.capacity < BLOCK {
            self.blocks[0] = doubled(&self.blocks[0], self.capacity, self.keys.len());
            self.capacity *= 2;
            return;
        }
        if self.blocks.len() == self.top_capacity {
            self.top = doubled(&self.top, self.top_capacity, self.blocks.len());
            self.top_capacity *= 2;
        }
        self.blocks.push(vec![0.0; 2 * self.capacity]);
    }

    /// Descends `tree` (leaves from `capacity`) to the leaf where `target` falls, skipping
    /// zero-weight subtrees even when rounding lands on their edge. Returns the leaf's index
    /// among the leaves.
    fn descend(tree: &[f64], capacity: usize, mut target: f64) -> (usize, f64) {
        let mut i = 1;
        while i < capacity {
            let left = tree[2 * i];
            if target < left || tree[2 * i + 1] <= 0.0 {
                i *= 2;
            } else {
                target -= left;
                i = 2 * i + 1;
            }
        }
        (i - capacity, target)
    }
}

/// Sets leaf `leaf` of the sum tree `tree` (leaves from `capacity`) and recomputes the sums
/// above it.
fn set_leaf(tree: &mut [f64], capacity: usize, leaf: usize, weight: f64) {
    let mut i = capacity + leaf;
    tree[i] = weight;
    while i > 1 {
        i /= 2;
        tree[i] = tree[2 * i] + tree[2 * i + 1];
    }
}

/// `tree` (leaves from `capacity`, the first `used` of them set) with twice the leaves.
fn doubled(tree: &[f64], capacity: usize, used: usize) -> Vec<f64> {
    let new_capacity = capacity * 2;
    let mut out = vec![0.0; 2 * new_capacity];
    out[new_capacity..new_capacity + used].copy_from_slice(&tree[capacity..capacity + used]);
    for i in (1..new_capacity).rev() {
        out[i] = out[2 * i] + out[2 * i + 1];
    }
    out
}

impl Selector for PrioritizedSelector {
    fn insert(&mut self, key: u64, _seq: u64, priority: f64) -> Result<u32> {
        let weight = self.weight(priority)?;
        let slot = next_slot(self.keys.len())?;
        if self.keys.len() == self.blocks.len() * self.capacity {
            self.grow();
        }
        self.keys.push(key);
        self.set(slot as usize, weight);
        Ok(slot)
    }
    fn update(&mut self, at: Place, priority: f64) -> Result<()> {
        let weight = self.weight(priority)?;
        debug_assert_eq!(self.keys[at.slot as usize], at.key);
        self.set(at.slot as usize, weight);
        Ok(())
    }
    fn delete(&mut self, at: Place) -> Option<(u64, u32)> {
        let slot = at.slot as usize;
        debug_assert_eq!(self.keys[slot], at.key);
        let last = self.keys.len() - 1;
        let mut moved = None;
        if slot != last {
            let key = self.keys[last];
            let weight = self.get(last);
            self.keys[slot] = key;
            self.set(slot, weight);
            moved = Some((key, at.slot));
        }
        self.set(last, 0.0);
        self.keys.pop();
        moved
    }
    fn sample(&mut self, rng: &mut StdRng) -> Option<(u64, f64)> {
        let n = self.keys.len();
        if n == 0 {
            return None;
        }
        let total = self.top[1];
        if total <= 0.0 {
            // Every weight is zero: fall back to uniform.
            return Some((self.keys[rng.random_range(0..n)], 1.0 / n as f64));
        }
        let (b, target) = Self::descend(&self.top, self.top_capacity, rng.random::<f64>() * total);
        let mut slot = usize::MAX;
        if b < self.blocks.len() && self.top[self.top_capacity + b] > 0.0 {
            let (leaf, _) = Self::descend(&self.blocks[b], self.capacity, target);
            slot = b * self.capacity + leaf;
        }
        if slot >= n || self.get(slot) <= 0.0 {
            // A safeguard: both descents visit only positive nodes, so this is not reached.
            slot = (0..n).rev().find(|&s| self.get(s) > 0.0)?;
        }
        let weight = self.get(slot);
        Some((self.keys[slot], weight / total))
    }
    fn clear(&mut self) {
        *self = Self::new(self.exponent);
    }
    fn len(&self) -> usize {
        self.keys.len()
    }
    fn total_weight(&self) -> f64 {
        self.top[1]
    }
}

/// Fifo / Lifo: keys in insertion order, found by the table's sequence numbers. A deleted
/// key's place stays in `order`, marked dead, until it reaches an end or dead places
/// outnumber live ones, when one linear pass drops them (no hashing: at 10M places a pass
/// takes milliseconds). The ends are always live. Inserts are O(1), deletes O(log n) (a
/// binary search by sequence number; O(1) at the ends, where Fifo and Lifo delete), sampling
/// O(1). A key costs 16 bytes of `order`.
pub struct Ordered {
    newest_first: bool,
    /// `(key, sequence number)` in insertion order, live and dead ([`DEAD`] set).
    order: VecDeque<(u64, u64)>,
    /// Live places in `order`.
    live: usize,
}

/// Marks a dead place's sequence number (sequence numbers stay below 2^63).
const DEAD: u64 = 1 << 63;

impl Ordered {
    fn new(newest_first: bool) -> Self {
        Self {
            newest_first,
            order: VecDeque::new(),
            live: 0,
        }
    }

    /// The position of the place with sequence number `seq` (which is in `order`).
    fn position(&self, seq: u64) -> usize {
        let at = |i: usize| self.order[i].1 & !DEAD;
        if at(0) == seq {
            return 0;
        }
        let last = self.order.len() - 1;
        if at(last) == seq {
            return last;
        }
        self.order
            .binary_search_by_key(&seq, |&(_, s)| s & !DEAD)
            .expect("a live key has a place")
    }

    /// Drops dead places from both ends, and all of them once they outnumber live ones.
    fn trim(&mut self) {
        while self.order.front().is_some_and(|p| p.1 & DEAD != 0) {
            self.order.pop_front();
        }
        while self.order.back().is_some_and(|p| p.1 & DEAD != 0) {
            self.order.pop_back();
        }
        if self.order.len() - self.live > self.live + 16 {
            self.order.retain(|p| p.1 & DEAD == 0);
        }
        // A table that shrank gives the memory of its bigger past back.
        if self.order.capacity() > 4 * self.order.len() + 1024 {
            self.order.shrink_to(2 * self.order.len());
        }
    }
}

impl Selector for Ordered {
    fn insert(&mut self, key: u64, seq: u64, _priority: f64) -> Result<u32> {
        debug_assert!(self.order.back().is_none_or(|p| p.1 & !DEAD < seq));
        self.order.push_back((key, seq));
        self.live += 1;
        Ok(0)
    }
    fn update(&mut self, _at: Place, _priority: f64) -> Result<()> {
        Ok(())
    }
    fn delete(&mut self, at: Place) -> Option<(u64, u32)> {
        let i = self.position(at.seq);
        debug_assert_eq!(self.order[i], (at.key, at.seq));
        self.order[i].1 |= DEAD;
        self.live -= 1;
        self.trim();
        None
    }
    fn sample(&mut self, _rng: &mut StdRng) -> Option<(u64, f64)> {
        let place = if self.newest_first {
            self.order.back()
        } else {
            self.order.front()
        };
        place.map(|&(key, _)| (key, 1.0))
    }
    fn clear(&mut self) {
        self.order = VecDeque::new();
        self.live = 0;
    }
    fn len(&self) -> usize {
        self.live
    }
}

/// A total order on f64 priorities (NaN is rejected before it gets here).
#[derive(Debug, Clone, Copy, PartialEq)]
struct OrdF64(f64);
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// MinHeap / MaxHeap: keys ordered by (priority, last insert/update sequence), so ties go to the
/// least recently inserted or updated key.
pub struct HeapSelector {
    min_heap: bool,
    next_seq: u64,
    ordered: BTreeMap<(OrdF64, u64), u64>,
    position: KeyMap<(OrdF64, u64)>,
}

impl HeapSelector {
    fn new(min_heap: bool) -> Self {
        Self {
            min_heap,
            next_seq: 0,
            ordered: BTreeMap::new(),
            position: KeyMap::new(),
        }
    }

    fn position_for(&mut self, priority: f64) -> Result<(OrdF64, u64)> {
        if priority.is_nan() {
            return Err(invalid_arg!("priority must not be NaN"));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        // Max-heap: order by negated priority so the first entry is always the one to pick.
        Ok((
            OrdF64(if self.min_heap { priority } else { -priority }),
            seq,
        ))
    }
}

impl Selector for HeapSelector {
    fn insert(&mut self, key: u64, _seq: u64, priority: f64) -> Result<u32> {
        let pos = self.position_for(priority)?;
        self.ordered.insert(pos, key);
        self.position.insert(key, pos);
        Ok(0)
    }
    fn update(&mut self, at: Place, priority: f64) -> Result<()> {
        let pos = self.position_for(priority)?;
        let old = self
            .position
            .insert(at.key, pos)
            .expect("the table updates present keys");
        self.ordered.remove(&old);
        self.ordered.insert(pos, at.key);
        Ok(())
    }
    fn delete(&mut self, at: Place) -> Option<(u64, u32)> {
        let pos = self
            .position
            .remove(&at.key)
            .expect("the table deletes present keys");
        self.ordered.remove(&pos);
        None
    }
    fn sample(&mut self, _rng: &mut StdRng) -> Option<(u64, f64)> {
        self.ordered.first_key_value().map(|(_, &key)| (key, 1.0))
    }
    fn clear(&mut self) {
        self.ordered.clear();
        self.position.clear();
    }
    fn len(&self) -> usize {
        self.position.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use std::collections::HashMap;

    fn rng() -> StdRng {
        StdRng::seed_from_u64(7)
    }

    /// A selector with the places of its keys kept as a table keeps them, so tests can
    /// address keys by key (and check the table's side of the contract: new keys only,
    /// present keys only, moves recorded).
    struct Keyed<S> {
        sel: S,
        places: HashMap<u64, Place>,
        next_seq: u64,
    }

    impl Keyed<Box<dyn Selector>> {
        fn build(kind: SelectorKind) -> Self {
            Keyed::new(kind.build().unwrap())
        }
    }

    impl<S: Selector> Keyed<S> {
        fn new(sel: S) -> Self {
            Self {
                sel,
                places: HashMap::new(),
                next_seq: 0,
            }
        }
        fn insert(&mut self, key: u64, priority: f64) -> Result<()> {
            if self.places.contains_key(&key) {
                return Err(invalid_arg!("key {key} is present"));
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            let slot = self.sel.insert(key, seq, priority)?;
            self.places.insert(key, Place { key, seq, slot });
            Ok(())
        }
        fn update(&mut self, key: u64, priority: f64) -> Result<()> {
            let at = *self
                .places
                .get(&key)
                .ok_or_else(|| invalid_arg!("no {key}"))?;
            self.sel.update(at, priority)
        }
        fn delete(&mut self, key: u64) -> Result<()> {
            let at = self
                .places
                .remove(&key)
                .ok_or_else(|| invalid_arg!("no {key}"))?;
            if let Some((moved, slot)) = self.sel.delete(at) {
                self.places
                    .get_mut(&moved)
                    .expect("a present key moved")
                    .slot = slot;
            }
            Ok(())
        }
        fn sample(&mut self, rng: &mut StdRng) -> Option<(u64, f64)> {
            self.sel.sample(rng)
        }
        fn len(&self) -> usize {
            assert_eq!(self.sel.len(), self.places.len());
            self.sel.len()
        }
        fn total_weight(&self) -> f64 {
            self.sel.total_weight()
        }
        fn clear(&mut self) {
            self.sel.clear();
            self.places.clear();
        }
    }

    impl Selector for Box<dyn Selector> {
        fn insert(&mut self, key: u64, seq: u64, priority: f64) -> Result<u32> {
            (**self).insert(key, seq, priority)
        }
        fn update(&mut self, at: Place, priority: f64) -> Result<()> {
            (**self).update(at, priority)
        }
        fn delete(&mut self, at: Place) -> Option<(u64, u32)> {
            (**self).delete(at)
        }
        fn sample(&mut self, rng: &mut StdRng) -> Option<(u64, f64)> {
            (**self).sample(rng)
        }
        fn clear(&mut self) {
            (**self).clear()
        }
        fn len(&self) -> usize {
            (**self).len()
        }
        fn total_weight(&self) -> f64 {
            (**self).total_weight()
        }
    }

    /// Draws `n` samples and returns the observed frequency of each key.
    fn frequencies<S: Selector>(sel: &mut Keyed<S>, n: usize) -> HashMap<u64, f64> {
        let mut rng = rng();
        let mut counts = HashMap::new();
        for _ in 0..n {
            let (k, _) = sel.sample(&mut rng).unwrap();
            *counts.entry(k).or_insert(0.0) += 1.0;
        }
        counts.values_mut().for_each(|c| *c /= n as f64);
        counts
    }

    #[test]
    fn uniform_distribution_and_probability() {
        let mut s = Keyed::build(SelectorKind::Uniform);
        for k in 0..10 {
            s.insert(k, 1.0).unwrap();
        }
        s.delete(3).unwrap();
        assert_eq!(s.total_weight(), 9.0);
        let (_, p) = s.sample(&mut rng()).unwrap();
        assert!((p - 1.0 / 9.0).abs() < 1e-12);
        let freq = frequencies(&mut s, 90_000);
        assert!(!freq.contains_key(&3));
        for k in (0..10).filter(|&k| k != 3) {
            // 5 standard deviations of a binomial(90000, 1/9) frequency is ~0.0052.
            assert!(
                (freq[&k] - 1.0 / 9.0).abs() < 0.006,
                "key {k}: {}",
                freq[&k]
            );
        }
    }

    #[test]
    fn prioritized_distribution_matches_weights() {
        let mut s = Keyed::build(SelectorKind::Prioritized {
            priority_exponent: 0.5,
        });
        let priorities = [(1u64, 1.0), (2, 4.0), (3, 9.0), (4, 0.0), (5, 16.0)];
        for (k, p) in priorities {
            s.insert(k, p).unwrap();
        }
        // weights 1, 2, 3, 0, 4 -> total 10
        assert!((s.total_weight() - 10.0).abs() < 1e-12);
        s.update(5, 0.0).unwrap();
        assert!((s.total_weight() - 6.0).abs() < 1e-12);
        s.update(5, 16.0).unwrap();
        let freq = frequencies(&mut s, 100_000);
        assert!(!freq.contains_key(&4), "zero priority is never sampled");
        for (k, w) in [(1u64, 0.1), (2, 0.2), (3, 0.3), (5, 0.4)] {
            assert!((freq[&k] - w).abs() < 0.008, "key {k}: {} vs {w}", freq[&k]);
        }
        let mut r = rng();
        for _ in 0..100 {
            let (k, p) = s.sample(&mut r).unwrap();
            let expected = [(1u64, 0.1), (2, 0.2), (3, 0.3), (5, 0.4)]
                .iter()
                .find(|e| e.0 == k)
                .unwrap()
                .1;
            assert!((p - expected).abs() < 1e-12);
        }
    }

    #[test]
    fn prioritized_zero_exponent_zero_priority_is_zero() {
        let mut s = Keyed::build(SelectorKind::Prioritized {
            priority_exponent: 0.0,
        });
        s.insert(1, 0.0).unwrap();
        s.insert(2, 5.0).unwrap();
        let freq = frequencies(&mut s, 1000);
        assert_eq!(freq.get(&2), Some(&1.0));
    }

    #[test]
    fn prioritized_all_zero_falls_back_to_uniform() {
        let mut s = Keyed::build(SelectorKind::Prioritized {
            priority_exponent: 1.0,
        });
        for k in 0..4 {
            s.insert(k, 0.0).unwrap();
        }
        let (_, p) = s.sample(&mut rng()).unwrap();
        assert_eq!(p, 0.25);
        let freq = frequencies(&mut s, 40_000);
        for k in 0..4 {
            assert!((freq[&k] - 0.25).abs() < 0.015);
        }
    }

    #[test]
    fn prioritized_grows_updates_and_deletes() {
        let mut s = Keyed::build(SelectorKind::Prioritized {
            priority_exponent: 1.0,
        });
        for k in 0..5000 {
            s.insert(k, 1.0).unwrap();
        }
        for k in 0..4999 {
            s.delete(k).unwrap();
        }
        let (k, p) = s.sample(&mut rng()).unwrap();
        assert_eq!((k, p), (4999, 1.0));
        s.update(4999, 0.0).unwrap();
        s.insert(10_000, 2.0).unwrap();
        assert_eq!(s.sample(&mut rng()).unwrap(), (10_000, 1.0));
        assert!(s.insert(10_000, 1.0).is_err());
        assert!(s.update(3, 1.0).is_err());
        assert!(s.insert(1, -1.0).is_err());
        assert!(s.insert(1, f64::NAN).is_err());
    }

    /// Every internal node of every tree is the sum of its children, and each block's total
    /// is its leaf in the top tree.
    fn assert_sums(s: &PrioritizedSelector) {
        for (b, block) in s.blocks.iter().enumerate() {
            for i in 1..s.capacity {
                assert_eq!(
                    block[i],
                    block[2 * i] + block[2 * i + 1],
                    "block {b} node {i}"
                );
            }
            assert_eq!(s.top[s.top_capacity + b], block[1], "block {b}'s total");
        }
        for i in 1..s.top_capacity {
            assert_eq!(s.top[i], s.top[2 * i] + s.top[2 * i + 1], "top node {i}");
        }
    }

    #[test]
    fn prioritized_growth_keeps_every_sum() {
        let mut s = Keyed::new(PrioritizedSelector::new(1.0));
        let n = 3 * BLOCK as u64 + 1;
        for k in 0..n {
            s.insert(k, 1.0 + (k % 4) as f64).unwrap();
        }
        assert_eq!((s.sel.blocks.len(), s.sel.top_capacity), (4, 4));
        assert_sums(&s.sel);
        let expected: f64 = (0..n).map(|k| 1.0 + (k % 4) as f64).sum();
        assert_eq!(s.total_weight(), expected);
        for k in (0..n).step_by(5) {
            s.delete(k).unwrap();
        }
        assert_sums(&s.sel);
    }

    #[test]
    fn prioritized_across_blocks() {
        // Three full blocks and part of a fourth: the top tree has grown twice.
        let n = 3 * BLOCK as u64 + 100;
        let mut s = Keyed::new(PrioritizedSelector::new(1.0));
        for k in 0..n {
            s.insert(k, 0.0).unwrap();
        }
        assert_eq!(s.sel.blocks.len(), 4);
        // Weights in the first, a middle and the last block.
        let weighted = [(5, 1.0), (BLOCK as u64 + 7, 2.0), (n - 1, 1.0)];
        for (k, w) in weighted {
            s.update(k, w).unwrap();
        }
        assert_eq!(s.total_weight(), 4.0);
        let f = frequencies(&mut s, 40_000);
        assert_eq!(f.len(), 3, "only weighted keys are drawn: {f:?}");
        for (k, w) in weighted {
            assert!(
                (f[&k] - w / 4.0).abs() < 0.015,
                "key {k}: {} vs {}",
                f[&k],
                w / 4.0
            );
        }
        let (k, p) = s.sample(&mut rng()).unwrap();
        assert_eq!(p, weighted.iter().find(|x| x.0 == k).unwrap().1 / 4.0);
        // Deleting from the first block moves the last slot (the last key, weight 1) there.
        s.delete(5).unwrap();
        assert_eq!(s.places[&(n - 1)].slot, 5);
        assert_eq!(s.total_weight(), 3.0);
        // Emptying the tail blocks leaves their (zero) trees in place; sampling still works.
        for k in (2 * BLOCK as u64)..(n - 1) {
            s.delete(k).unwrap();
        }
        assert_eq!(s.len(), 2 * BLOCK);
        let f = frequencies(&mut s, 30_000);
        assert_eq!(f.len(), 2);
        assert!((f[&(n - 1)] - 1.0 / 3.0).abs() < 0.015);
        // Refilling reuses the blocks without growing.
        for k in 0..BLOCK as u64 {
            s.insert(n + k, 1.0).unwrap();
        }
        assert_eq!(s.sel.blocks.len(), 4);
        assert_eq!(s.total_weight(), 3.0 + BLOCK as f64);
        s.clear();
        assert_eq!((s.len(), s.total_weight(), s.sel.blocks.len()), (0, 0.0, 1));
    }

    #[test]
    fn fifo_and_lifo_order() {
        let mut fifo = Keyed::build(SelectorKind::Fifo);
        let mut lifo = Keyed::build(SelectorKind::Lifo);
        for k in [5u64, 3, 9] {
            fifo.insert(k, 0.0).unwrap();
            lifo.insert(k, 0.0).unwrap();
        }
        assert_eq!(fifo.sample(&mut rng()), Some((5, 1.0)));
        assert_eq!(lifo.sample(&mut rng()), Some((9, 1.0)));
        fifo.delete(5).unwrap();
        lifo.delete(9).unwrap();
        assert_eq!(fifo.sample(&mut rng()), Some((3, 1.0)));
        assert_eq!(lifo.sample(&mut rng()), Some((3, 1.0)));
    }

    #[test]
    fn heap_ties_go_to_least_recently_touched() {
        let mut min = Keyed::build(SelectorKind::MinHeap);
        let mut max = Keyed::build(SelectorKind::MaxHeap);
        for (k, p) in [(1u64, 2.0), (2, 1.0), (3, 1.0), (4, 3.0), (5, 3.0)] {
            min.insert(k, p).unwrap();
            max.insert(k, p).unwrap();
        }
        assert_eq!(min.sample(&mut rng()), Some((2, 1.0)));
        assert_eq!(max.sample(&mut rng()), Some((4, 1.0)));
        // Updating key 2 to the same priority makes it the most recently touched.
        min.update(2, 1.0).unwrap();
        assert_eq!(min.sample(&mut rng()), Some((3, 1.0)));
        max.update(4, 3.0).unwrap();
        assert_eq!(max.sample(&mut rng()), Some((5, 1.0)));
    }

    #[test]
    fn options_round_trip() {
        for kind in [
            SelectorKind::Uniform,
            SelectorKind::Prioritized {
                priority_exponent: 0.8,
            },
            SelectorKind::Fifo,
            SelectorKind::Lifo,
            SelectorKind::MinHeap,
            SelectorKind::MaxHeap,
        ] {
            assert_eq!(SelectorKind::from_options(&kind.options()).unwrap(), kind);
        }
        assert!(SelectorKind::Fifo.options().is_deterministic);
        assert!(!SelectorKind::Uniform.options().is_deterministic);
    }

    proptest! {
        // Fifo and Lifo give the oldest and newest live key whatever was deleted before
        // (re-inserted keys too), and dead places stay bounded.
        #[test]
        fn fifo_and_lifo_take_the_oldest_and_newest_live_key(
            ops in proptest::collection::vec((any::<bool>(), 0u64..60), 1..3000)
        ) {
            for newest_first in [false, true] {
                let mut s = Keyed::new(Ordered::new(newest_first));
                let mut model: Vec<u64> = Vec::new(); // live keys in insertion order
                for &(insert, key) in &ops {
                    let present = model.iter().position(|&k| k == key);
                    match (insert, present) {
                        (true, None) => { s.insert(key, 0.0).unwrap(); model.push(key); }
                        (true, Some(_)) => prop_assert!(s.insert(key, 0.0).is_err()),
                        (false, Some(i)) => { s.delete(key).unwrap(); model.remove(i); }
                        (false, None) => prop_assert!(s.delete(key).is_err()),
                    }
                    let expect = if newest_first { model.last() } else { model.first() };
                    prop_assert_eq!(s.sample(&mut rng()), expect.map(|&k| (k, 1.0)));
                    prop_assert_eq!(s.len(), model.len());
                    // Dead places never outnumber live ones by more than the slack.
                    prop_assert!(s.sel.order.len() <= 2 * model.len() + 16);
                    let dead = s.sel.order.iter().filter(|p| p.1 & DEAD != 0).count();
                    prop_assert_eq!(dead, s.sel.order.len() - model.len());
                }
            }
        }

        // Any sequence of inserts/updates/deletes keeps every selector consistent with a model.
        #[test]
        fn selectors_agree_with_model(ops in proptest::collection::vec((0u8..3, 0u64..20, 0.0f64..10.0), 1..200)) {
            let kinds = [SelectorKind::Uniform, SelectorKind::Prioritized { priority_exponent: 1.0 },
                SelectorKind::Fifo, SelectorKind::Lifo, SelectorKind::MinHeap, SelectorKind::MaxHeap];
            for kind in kinds {
                let mut s = Keyed::build(kind);
                let mut model: Vec<(u64, f64)> = Vec::new(); // insertion/update order
                for &(op, key, prio) in &ops {
                    let present = model.iter().position(|e| e.0 == key);
                    match (op, present) {
                        (0, None) => { s.insert(key, prio).unwrap(); model.push((key, prio)); }
                        (0, Some(_)) => prop_assert!(s.insert(key, prio).is_err()),
                        (1, Some(i)) => { s.update(key, prio).unwrap(); model.remove(i); model.push((key, prio)); }
                        (1, None) => prop_assert!(s.update(key, prio).is_err()),
                        (_, Some(i)) => { s.delete(key).unwrap(); model.remove(i); }
                        (_, None) => prop_assert!(s.delete(key).is_err()),
                    }
                    prop_assert_eq!(s.len(), model.len());
                    let got = s.sample(&mut rng());
                    if model.is_empty() { prop_assert!(got.is_none()); continue; }
                    let (k, p) = got.unwrap();
                    prop_assert!(model.iter().any(|e| e.0 == k));
                    match kind {
                        SelectorKind::MinHeap => {
                            let best = model.iter().fold(f64::INFINITY, |m, e| m.min(e.1));
                            let expect = model.iter().find(|e| e.1 == best).unwrap().0;
                            prop_assert_eq!((k, p), (expect, 1.0));
                        }
                        SelectorKind::MaxHeap => {
                            let best = model.iter().fold(f64::NEG_INFINITY, |m, e| m.max(e.1));
                            let expect = model.iter().find(|e| e.1 == best).unwrap().0;
                            prop_assert_eq!((k, p), (expect, 1.0));
                        }
                        SelectorKind::Prioritized { .. } => {
                            let total: f64 = model.iter().map(|e| e.1).sum();
                            let w = model.iter().find(|e| e.0 == k).unwrap().1;
                            let expect = if total > 0.0 { w / total } else { 1.0 / model.len() as f64 };
                            prop_assert!((p - expect).abs() < 1e-9);
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}
