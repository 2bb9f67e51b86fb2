//! Uniform: every key equally likely (`1/n`), O(1) throughout.

use super::{next_slot, Place, Selector};
use crate::Result;
use rand::{rngs::StdRng, Rng};

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
