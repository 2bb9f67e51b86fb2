//! MinHeap / MaxHeap: the key of the lowest or highest priority, ties to the least recently
//! inserted or updated key, probability 1.0.

use super::{Place, Selector};
use crate::keymap::KeyMap;
use crate::{invalid_arg, Result};
use rand::rngs::StdRng;
use std::collections::BTreeMap;

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
    pub(super) fn new(min_heap: bool) -> Self {
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
