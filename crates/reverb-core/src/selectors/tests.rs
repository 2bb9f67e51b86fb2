//! The selectors' contract and distributions, one by one and as a table drives them.

use super::ordered::DEAD;
use super::prioritized::BLOCK;
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
    fn sample_many(&mut self, rng: &mut StdRng, n: usize, out: &mut Vec<(u64, f64)>) {
        (**self).sample_many(rng, n, out)
    }
    fn update_many(&mut self, updates: &[(Place, f64)]) -> Result<()> {
        (**self).update_many(updates)
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
                // Fifo knows its next victims: the oldest live keys, in order.
                let mut upcoming = Vec::new();
                s.sel.upcoming(5, &mut upcoming);
                let oldest: Vec<u64> = model.iter().take(5).copied().collect();
                prop_assert_eq!(upcoming, if newest_first { vec![] } else { oldest });
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    // The prioritized selector's batches are its single calls: `sample_many` draws what as
    // many `sample`s draw from the same random numbers, and `update_many` leaves the very
    // trees (every sum, bit for bit) that updates one by one leave, within a block and
    // across blocks, repeated keys and zero weights included.
    #[test]
    fn prioritized_batches_are_single_calls(
        keys in prop_oneof![1u64..3000, (BLOCK as u64 - 50)..(BLOCK as u64 + 2000)],
        seed in any::<u64>(),
        updates in proptest::collection::vec((any::<prop::sample::Index>(), 0u32..5), 0..300),
        n in 0usize..300,
    ) {
        let build = || {
            let mut s = Keyed::new(PrioritizedSelector::new(0.6));
            for k in 0..keys {
                s.insert(k, 1.0 + (k % 7) as f64).unwrap();
            }
            s
        };
        let (mut one, mut many) = (build(), build());
        let updates: Vec<(u64, f64)> = updates
            .iter()
            .map(|(i, p)| (i.index(keys as usize) as u64, *p as f64 * 0.5))
            .collect();
        for &(k, p) in &updates {
            one.update(k, p).unwrap();
        }
        let places: Vec<(Place, f64)> =
            updates.iter().map(|&(k, p)| (many.places[&k], p)).collect();
        many.sel.update_many(&places).unwrap();
        prop_assert_eq!(&one.sel.blocks, &many.sel.blocks);
        prop_assert_eq!(&one.sel.top, &many.sel.top);
        assert_sums(&many.sel);
        let mut rng_one = StdRng::seed_from_u64(seed);
        let singles: Vec<(u64, f64)> = (0..n).filter_map(|_| one.sample(&mut rng_one)).collect();
        let mut rng_many = StdRng::seed_from_u64(seed);
        let mut batch = Vec::new();
        many.sel.sample_many(&mut rng_many, n, &mut batch);
        prop_assert_eq!(singles, batch);
    }
}
