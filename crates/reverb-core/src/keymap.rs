//! `KeyMap`: the hash map a table indexes its items by (item keys, episode ids), split into
//! shards that grow one at a time.
//!
//! One hash table doubles all at once when it fills: at 7M items a table's indexes took
//! seconds to copy inside a single insert, with the table's lock held, so every sampler of
//! the table stalled as long (`cargo run --release -p reverb-core --example growth`). In
//! `SHARDS` maps, picked by the key, each growth copies one shard: a pause of about
//! 1/`SHARDS` of that, and the shards' growths fall on different inserts.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;

const SHARD_BITS: u32 = 8;
/// Number of shards.
pub const SHARDS: usize = 1 << SHARD_BITS;

/// A map from `u64` keys, in `SHARDS` independently growing shards.
#[derive(Debug, Clone)]
pub struct KeyMap<V> {
    shards: Box<[HashMap<u64, V>]>,
    len: usize,
}

impl<V> Default for KeyMap<V> {
    fn default() -> Self {
        Self::new()
    }
}

/// The shard of `key`: the top bits of a multiplicative hash, so sequential keys spread as
/// well as random ones (the shards' own hashers use independent, randomly seeded hashes).
fn shard(key: u64) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SHARD_BITS)) as usize
}

impl<V> KeyMap<V> {
    /// An empty map (its shards allocate nothing until used).
    pub fn new() -> Self {
        let state = RandomState::new();
        Self {
            shards: (0..SHARDS)
                .map(|_| HashMap::with_hasher(state.clone()))
                .collect(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, key: &u64) -> Option<&V> {
        self.shards[shard(*key)].get(key)
    }

    pub fn get_mut(&mut self, key: &u64) -> Option<&mut V> {
        self.shards[shard(*key)].get_mut(key)
    }

    pub fn contains_key(&self, key: &u64) -> bool {
        self.shards[shard(*key)].contains_key(key)
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        let old = self.shards[shard(key)].insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, key: &u64) -> Option<V> {
        let old = self.shards[shard(*key)].remove(key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// The value of `key`, inserted from `default()` first if absent.
    pub fn get_or_insert_with(&mut self, key: u64, default: impl FnOnce() -> V) -> &mut V {
        let map = &mut self.shards[shard(key)];
        let len = &mut self.len;
        map.entry(key).or_insert_with(|| {
            *len += 1;
            default()
        })
    }

    /// Removes everything and frees the shards' memory.
    pub fn clear(&mut self) {
        for map in self.shards.iter_mut() {
            *map = HashMap::with_hasher(map.hasher().clone());
        }
        self.len = 0;
    }

    /// Every value, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.shards.iter().flat_map(|m| m.values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        Bump(u64),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct keys, so that operations meet the same key often.
        let key = prop_oneof![0u64..64, any::<u64>()];
        prop_oneof![
            8 => (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            4 => key.clone().prop_map(Op::Remove),
            4 => key.prop_map(Op::Bump),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// A KeyMap answers every call as one HashMap does.
        #[test]
        fn behaves_as_one_hash_map(ops in prop::collection::vec(op(), 0..400)) {
            let mut ours: KeyMap<u32> = KeyMap::new();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(ours.insert(k, v), model.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(ours.remove(&k), model.remove(&k)),
                    Op::Bump(k) => {
                        *ours.get_or_insert_with(k, || 0) += 1;
                        *model.entry(k).or_insert(0) += 1;
                    }
                    Op::Clear => {
                        ours.clear();
                        model.clear();
                    }
                }
                prop_assert_eq!(ours.len(), model.len());
                prop_assert_eq!(ours.is_empty(), model.is_empty());
            }
            for (k, v) in &model {
                prop_assert_eq!(ours.get(k), Some(v));
                prop_assert!(ours.contains_key(k));
            }
            let mut values: Vec<u32> = ours.values().copied().collect();
            let mut expected: Vec<u32> = model.values().copied().collect();
            values.sort_unstable();
            expected.sort_unstable();
            prop_assert_eq!(values, expected);
        }
    }

    #[test]
    fn sequential_keys_spread_over_the_shards() {
        let mut counts = vec![0usize; SHARDS];
        for key in 0..(SHARDS as u64 * 1000) {
            counts[shard(key)] += 1;
        }
        let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*min > 900 && *max < 1100, "shard sizes {min}..{max}");
    }
}
