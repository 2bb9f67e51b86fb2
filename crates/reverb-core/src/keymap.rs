//! `KeyMap`: the hash map a table indexes its items by (item keys, episode ids), split into
//! shards that grow one at a time once it is big.
//!
//! One hash table doubles all at once when it fills: at 7M items a table's indexes took
//! seconds to copy inside a single insert, with the table's lock held, so every sampler of
//! the table stalled as long (`cargo run --release -p reverb-core --example growth`). Past
//! `SPLIT_AT` entries a `KeyMap` is `SHARDS` maps, picked by the key, and each growth copies
//! one shard: the same total work, in pauses of about 1/`SHARDS` of one, on different
//! inserts. A map stays one map until it first holds `SPLIT_AT` entries, so a small table
//! costs no more memory than with one map.
//! Keys are hashed as [`KeyHashMap`] hashes them. A table has one such map of its items (its
//! selectors find a key by the place the table keeps for it) and one of its episodes.

use foldhash::fast::RandomState;
use reverb_proto::KeyHashMap;
use std::collections::hash_map::Entry;

const SHARD_BITS: u32 = 8;
/// Number of shards of a big map.
pub const SHARDS: usize = 1 << SHARD_BITS;
/// Entries at which a map is split into shards, before its next growth: a full map of 8,192
/// buckets (one growth of a map this size takes about a millisecond). Small in tests, so that
/// the crate's tests run sharded maps too.
#[cfg(not(test))]
pub const SPLIT_AT: usize = 7 * 1024;
#[cfg(test)]
pub const SPLIT_AT: usize = 16;

/// A map from `u64` keys: one map while small, `SHARDS` independently growing ones once big.
#[derive(Debug, Clone)]
pub struct KeyMap<V> {
    /// One map, or `SHARDS`.
    shards: Vec<KeyHashMap<V>>,
    state: RandomState,
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
    /// An empty map (it allocates nothing until used).
    pub fn new() -> Self {
        let state = RandomState::default();
        Self {
            shards: vec![KeyHashMap::with_hasher(state)],
            state,
            len: 0,
        }
    }

    fn map(&self, key: u64) -> &KeyHashMap<V> {
        match self.shards.len() {
            1 => &self.shards[0],
            _ => &self.shards[shard(key)],
        }
    }

    fn map_mut(&mut self, key: u64) -> &mut KeyHashMap<V> {
        match self.shards.len() {
            1 => &mut self.shards[0],
            _ => &mut self.shards[shard(key)],
        }
    }

    /// Splits the one map into `SHARDS` once it holds `SPLIT_AT` entries (called before an
    /// insert, so the one map never grows past that).
    fn split_if_big(&mut self) {
        if self.shards.len() > 1 || self.len < SPLIT_AT {
            return;
        }
        let one = std::mem::take(&mut self.shards).pop().expect("one map");
        self.shards = (0..SHARDS)
            .map(|_| KeyHashMap::with_hasher(self.state))
            .collect();
        for (key, value) in one {
            self.shards[shard(key)].insert(key, value);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, key: &u64) -> Option<&V> {
        self.map(*key).get(key)
    }

    pub fn get_mut(&mut self, key: &u64) -> Option<&mut V> {
        self.map_mut(*key).get_mut(key)
    }

    pub fn contains_key(&self, key: &u64) -> bool {
        self.map(*key).contains_key(key)
    }

    /// Inserts or replaces; returns the value replaced.
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        self.split_if_big();
        let old = self.map_mut(key).insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove(&mut self, key: &u64) -> Option<V> {
        let old = self.map_mut(*key).remove(key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    /// The value of `key`, inserted from `default()` first if absent.
    pub fn get_or_insert_with(&mut self, key: u64, default: impl FnOnce() -> V) -> &mut V {
        self.split_if_big();
        let map = match self.shards.len() {
            1 => &mut self.shards[0],
            _ => &mut self.shards[shard(key)],
        };
        match map.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let value = default();
                self.len += 1;
                e.insert(value)
            }
        }
    }

    /// Removes everything and frees the memory (back to one map).
    pub fn clear(&mut self) {
        self.shards = vec![KeyHashMap::with_hasher(self.state)];
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
            let mut model: std::collections::HashMap<u64, u32> = Default::default();
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
    fn a_big_map_splits_and_keeps_every_entry() {
        let mut map: KeyMap<u64> = KeyMap::new();
        let n = SPLIT_AT as u64 * 2;
        for key in 0..n {
            assert_eq!(map.insert(key * 7, key), None);
            if key as usize == SPLIT_AT - 1 {
                assert_eq!(map.shards.len(), 1, "one map up to SPLIT_AT entries");
            }
            if key as usize == SPLIT_AT {
                assert_eq!(map.shards.len(), SHARDS, "split before the next insert");
            }
        }
        assert_eq!(map.shards.len(), SHARDS);
        assert_eq!(map.len(), n as usize);
        for key in (0..n).step_by(3) {
            assert_eq!(map.remove(&(key * 7)), Some(key));
        }
        for key in 0..n {
            assert_eq!(map.get(&(key * 7)).copied(), (key % 3 != 0).then_some(key));
            assert_eq!(map.contains_key(&(key * 7)), key % 3 != 0);
            *map.get_or_insert_with(key * 7, || 0) += 1;
            // Removed keys come back as 0 + 1; the others were `key`.
            let want = if key % 3 == 0 { 1 } else { key + 1 };
            assert_eq!(map.get_mut(&(key * 7)).copied(), Some(want));
        }
        assert_eq!(map.len(), n as usize);
        assert_eq!(map.values().count(), map.len());
        map.clear();
        assert!(map.is_empty() && map.shards.len() == 1 && map.get(&7).is_none());
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
