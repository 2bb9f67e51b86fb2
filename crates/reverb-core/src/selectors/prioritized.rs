//! Prioritized(α): keys drawn with probability `p^α / Σ p^α` from sum trees (O(log n)).

use super::{next_slot, Place, Selector};
use crate::{invalid_arg, Result};
use rand::{rngs::StdRng, Rng};

/// Leaves of one block of the prioritized sum tree. A table's first block starts small and
/// doubles up to this; past it the table adds blocks, so growing never copies more than one
/// block (a single tree of 16M leaves took 0.4 s to double with the table's lock held).
pub(super) const BLOCK: usize = 1 << 16;

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
    pub(super) exponent: f64,
    /// Each block's tree: `block[capacity + i]` holds the weight of the block's slot `i`,
    /// `block[j] = block[2j] + block[2j+1]`, `block[1]` the block's total.
    pub(super) blocks: Vec<Vec<f64>>,
    /// Leaves per block (`BLOCK` once there are two blocks).
    pub(super) capacity: usize,
    /// The same over the blocks' totals: `top[top_capacity + b]` is block `b`'s total.
    pub(super) top: Vec<f64>,
    pub(super) top_capacity: usize,
    /// The key in each slot.
    pub(super) keys: Vec<u64>,
}

impl PrioritizedSelector {
    pub(super) fn new(exponent: f64) -> Self {
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
    /// The descents of the `n` draws go down the trees together, a level at a time, each
    /// prefetching its next node: one draw's cache misses no longer wait for the last's.
    fn sample_many(&mut self, rng: &mut StdRng, n: usize, out: &mut Vec<(u64, f64)>) {
        let total = self.top[1];
        if self.keys.is_empty() || total <= 0.0 {
            for _ in 0..n {
                out.extend(self.sample(rng));
            }
            return;
        }
        // (block, node in its tree, what is left of the target), from the same random
        // numbers in the same order as single draws.
        let mut at: Vec<(usize, usize, f64)> = (0..n)
            .map(|_| {
                let (b, target) =
                    Self::descend(&self.top, self.top_capacity, rng.random::<f64>() * total);
                (b, 1, target)
            })
            .collect();
        let mut i = 1;
        while i < self.capacity {
            for (b, node, target) in at.iter_mut() {
                let Some(tree) = self.blocks.get(*b) else {
                    continue;
                };
                let left = tree[2 * *node];
                if *target < left || tree[2 * *node + 1] <= 0.0 {
                    *node *= 2;
                } else {
                    *target -= left;
                    *node = 2 * *node + 1;
                }
                if let Some(next) = tree.get(2 * *node) {
                    reverb_proto::prefetch(next);
                }
            }
            i *= 2;
        }
        let n_keys = self.keys.len();
        for (b, node, _) in at {
            let mut slot = usize::MAX;
            if b < self.blocks.len() && self.top[self.top_capacity + b] > 0.0 {
                slot = b * self.capacity + (node - self.capacity);
            }
            if slot >= n_keys || self.get(slot) <= 0.0 {
                // (The safeguard of `sample`.)
                match (0..n_keys).rev().find(|&s| self.get(s) > 0.0) {
                    Some(s) => slot = s,
                    None => continue,
                }
            }
            out.push((self.keys[slot], self.get(slot) / total));
        }
    }
    /// Leaves first, then the sums above them a level at a time (every node above a changed
    /// leaf recomputed from its children, as single updates leave it: the same trees).
    fn update_many(&mut self, updates: &[(Place, f64)]) -> Result<()> {
        let weights = updates
            .iter()
            .map(|&(_, p)| self.weight(p))
            .collect::<Result<Vec<f64>>>()?;
        let cap = self.capacity;
        for (&(at, _), &w) in updates.iter().zip(&weights) {
            let slot = at.slot as usize;
            debug_assert_eq!(self.keys[slot], at.key);
            self.blocks[slot / cap][cap + slot % cap] = w;
        }
        let mut level = 1;
        while (cap >> level) >= 1 {
            for &(at, _) in updates {
                let slot = at.slot as usize;
                let node = (cap + slot % cap) >> level;
                let tree = &mut self.blocks[slot / cap];
                tree[node] = tree[2 * node] + tree[2 * node + 1];
            }
            level += 1;
        }
        let mut blocks: Vec<usize> = updates
            .iter()
            .map(|(at, _)| at.slot as usize / cap)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        for b in blocks {
            set_leaf(&mut self.top, self.top_capacity, b, self.blocks[b][1]);
        }
        Ok(())
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
