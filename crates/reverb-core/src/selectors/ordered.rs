//! Fifo / Lifo: the oldest or the newest key, probability 1.0.

use super::{Place, Selector};
use crate::Result;
use rand::rngs::StdRng;
use std::collections::VecDeque;

/// Fifo / Lifo: keys in insertion order, found by the table's sequence numbers. A deleted
/// key's place stays in `order`, marked dead, until it reaches an end or dead places
/// outnumber live ones, when one linear pass drops them (no hashing: at 10M places a pass
/// takes milliseconds). The ends are always live. Inserts are O(1), deletes O(log n) (a
/// binary search by sequence number; O(1) at the ends, where Fifo and Lifo delete), sampling
/// O(1). A key costs 16 bytes of `order`.
pub struct Ordered {
    pub(super) newest_first: bool,
    /// `(key, sequence number)` in insertion order, live and dead ([`DEAD`] set).
    pub(super) order: VecDeque<(u64, u64)>,
    /// Live places in `order`.
    pub(super) live: usize,
}

/// Marks a dead place's sequence number (sequence numbers stay below 2^63).
pub(super) const DEAD: u64 = 1 << 63;

impl Ordered {
    pub(super) fn new(newest_first: bool) -> Self {
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
    fn upcoming(&self, n: usize, out: &mut Vec<u64>) {
        if !self.newest_first {
            let live = self.order.iter().filter(|p| p.1 & DEAD == 0);
            out.extend(live.take(n).map(|&(key, _)| key));
        }
    }
    fn clear(&mut self) {
        self.order = VecDeque::new();
        self.live = 0;
    }
    fn len(&self) -> usize {
        self.live
    }
}
