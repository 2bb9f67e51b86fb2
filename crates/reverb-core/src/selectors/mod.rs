//! Item selectors: which key a table samples or removes next.
//!
//! | selector | cost | probability returned |
//! |---|---|---|
//! | Uniform | O(1) | `1/n` |
//! | Prioritized(α) | O(log n), sum tree | `p^α / Σ p^α` (`0^α = 0`; all-zero → uniform) |
//! | Fifo / Lifo | O(1), deletes inside O(log n) | 1.0 |
//! | MinHeap / MaxHeap | O(log n); ties → least recently inserted/updated | 1.0 |

mod heap;
mod ordered;
mod prioritized;
mod uniform;

pub use heap::HeapSelector;
pub use ordered::Ordered;
pub use prioritized::{prioritized_weight, PrioritizedSelector, MAX_WEIGHT};
pub use uniform::Uniform;

use crate::keymap::KeyMap;
use crate::{invalid_arg, Result};
use rand::rngs::StdRng;
use reverb_proto::key_distribution_options::{Distribution, Heap, Prioritized};
use reverb_proto::KeyDistributionOptions;

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
    /// Picks `n` keys as `n` calls of [`Selector::sample`] would (the same keys from the
    /// same random numbers), appending them to `out`; fewer only when empty.
    fn sample_many(&mut self, rng: &mut StdRng, n: usize, out: &mut Vec<(u64, f64)>) {
        for _ in 0..n {
            match self.sample(rng) {
                Some(drawn) => out.push(drawn),
                None => break,
            }
        }
    }
    /// Changes the priorities of the keys at the places given, as [`Selector::update`] of
    /// each in turn would. Errs on a priority the selector does not take (which the table
    /// checks before).
    fn update_many(&mut self, updates: &[(Place, f64)]) -> Result<()> {
        updates.iter().try_for_each(|&(at, p)| self.update(at, p))
    }
    /// The keys the next `n` calls of [`Selector::sample`] would return, when the selector
    /// knows them ahead (Fifo: the oldest keys, which inserts do not change), appended to
    /// `out`; the others add nothing. A hint, for warming caches.
    fn upcoming(&self, _n: usize, _out: &mut Vec<u64>) {}
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
pub(crate) fn next_slot(len: usize) -> Result<u32> {
    u32::try_from(len).map_err(|_| invalid_arg!("a selector holds at most {} keys", u32::MAX))
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
    fn sample_many(&mut self, rng: &mut StdRng, n: usize, out: &mut Vec<(u64, f64)>) {
        self.inner.sample_many(rng, n, out)
    }
    fn update_many(&mut self, updates: &[(Place, f64)]) -> Result<()> {
        let updates: Vec<(Place, f64)> =
            updates.iter().map(|&(at, p)| (self.place(at), p)).collect();
        self.inner.update_many(&updates)
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

#[cfg(test)]
mod tests;
