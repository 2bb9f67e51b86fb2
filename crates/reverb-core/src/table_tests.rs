//! Table behaviour: eviction, max_times_sampled, rate limiting, chunk lifetimes, counters.

use crate::*;
use bytes::Bytes;
use reverb_proto::{flat_trajectory, ChunkData, FlatTrajectory, SequenceRange};
use std::sync::{Arc, Weak};

fn limiter(min_size: i64) -> RateLimiterConfig {
    RateLimiterConfig::min_size(min_size)
}

fn config(sampler: SelectorKind, remover: SelectorKind, max_size: i64) -> TableConfig {
    TableConfig {
        name: "t".into(),
        sampler,
        remover,
        max_size,
        max_times_sampled: 0,
        rate_limiter: limiter(1),
        signature: None,
    }
}

/// A FIFO queue of `max_size` items, each sampled once, whose inserts wait while `size`
/// items are unsampled (the reference's `Queue` limiter).
fn queue(max_size: i64, size: i64) -> TableConfig {
    let mut c = config(SelectorKind::Fifo, SelectorKind::Fifo, max_size);
    c.max_times_sampled = 1;
    c.rate_limiter = RateLimiterConfig {
        samples_per_insert: 1.0,
        min_size_to_sample: 1,
        min_diff: 0.0,
        max_diff: size as f64,
    };
    c
}

fn chunk(key: u64, episode: u64) -> Arc<Chunk> {
    Arc::new(Chunk::new(ChunkData {
        chunk_key: key,
        sequence_range: Some(SequenceRange {
            episode_id: episode,
            start: 0,
            end: 0,
            sparse: false,
        }),
        data: Bytes::from(vec![0u8; 10]),
        ..Default::default()
    }))
}

fn item(key: u64, chunks: Vec<Arc<Chunk>>) -> ItemData {
    let columns = chunks
        .iter()
        .map(|c| flat_trajectory::Column {
            chunk_slices: vec![flat_trajectory::ChunkSlice {
                chunk_key: c.key(),
                offset: 0,
                length: 1,
                index: 0,
            }],
            squeeze: false,
        })
        .collect();
    ItemData::new(key, &FlatTrajectory { columns }, chunks).unwrap()
}

fn insert(t: &Table, key: u64, priority: f64) {
    assert!(matches!(
        t.try_insert(item(key, vec![chunk(key, key)]), priority)
            .unwrap(),
        InsertOutcome::Inserted
    ));
}

#[test]
fn fifo_eviction_happens_after_insertion() {
    let t = Table::new(config(SelectorKind::Uniform, SelectorKind::Fifo, 3)).unwrap();
    for k in 1..=4 {
        insert(&t, k, 1.0);
    }
    assert_eq!(t.size(), 3);
    assert!(t.get(1).is_none(), "oldest evicted");
    // A LIFO remover evicts the item that was just inserted.
    let t = Table::new(config(SelectorKind::Uniform, SelectorKind::Lifo, 2)).unwrap();
    for k in 1..=3 {
        insert(&t, k, 1.0);
    }
    assert!(t.get(3).is_none() && t.get(1).is_some() && t.get(2).is_some());
    let info = t.info();
    assert_eq!(info.current_size, 2);
    assert_eq!(info.num_deleted_episodes, 1);
    assert_eq!(
        info.rate_limiter_info
            .unwrap()
            .insert_stats
            .unwrap()
            .completed,
        3
    );
}

#[test]
fn existing_key_only_updates_priority() {
    let t = Table::new(config(SelectorKind::MaxHeap, SelectorKind::Fifo, 10)).unwrap();
    insert(&t, 1, 1.0);
    insert(&t, 2, 2.0);
    assert!(matches!(
        t.try_insert(item(1, vec![chunk(9, 9)]), 5.0).unwrap(),
        InsertOutcome::Updated
    ));
    assert_eq!(t.size(), 2);
    let s = t.try_sample(1, usize::MAX);
    assert_eq!(s[0].item.key, 1);
    assert_eq!(s[0].priority, 5.0);
}

#[test]
fn max_times_sampled_deletes_inside_sampling() {
    let mut c = config(SelectorKind::Fifo, SelectorKind::Fifo, 10);
    c.max_times_sampled = 2;
    let t = Table::new(c).unwrap();
    insert(&t, 1, 1.0);
    insert(&t, 2, 1.0);
    let s = t.try_sample(10, usize::MAX);
    let keys: Vec<u64> = s.iter().map(|s| s.item.key).collect();
    assert_eq!(keys, vec![1, 1, 2, 2]);
    assert_eq!(s[1].times_sampled, 2);
    assert_eq!(s[0].table_size, 2);
    assert_eq!(s[2].table_size, 1);
    assert_eq!(t.size(), 0);
    assert_eq!(t.info().num_unique_samples, 2);
}

#[test]
fn queue_blocks_inserts_when_full_and_samples_when_empty() {
    let c = queue(2, 2);
    let t = Table::new(c).unwrap();
    assert!(t.try_sample(1, usize::MAX).is_empty());
    insert(&t, 1, 0.0);
    insert(&t, 2, 0.0);
    match t.try_insert(item(3, vec![chunk(3, 3)]), 0.0).unwrap() {
        InsertOutcome::Blocked(i) => assert_eq!(i.key, 3),
        other => panic!("expected Blocked, got {other:?}"),
    }
    assert_eq!(t.try_sample(1, usize::MAX)[0].item.key, 1);
    insert(&t, 3, 0.0);
    let keys: Vec<u64> = t
        .try_sample(5, usize::MAX)
        .iter()
        .map(|s| s.item.key)
        .collect();
    assert_eq!(keys, vec![2, 3]);
}

#[test]
fn sample_batch_stops_at_byte_budget() {
    let t = Table::new(config(SelectorKind::Uniform, SelectorKind::Fifo, 10)).unwrap();
    insert(&t, 1, 1.0);
    // Each item carries 10 bytes: a 25 byte budget admits 3 samples (stops once >= 25).
    assert_eq!(t.try_sample(100, 25).len(), 3);
}

#[test]
fn chunks_shared_across_tables_live_until_last_item() {
    let a = Table::new(config(SelectorKind::Uniform, SelectorKind::Fifo, 1)).unwrap();
    let b = Table::new(config(SelectorKind::Uniform, SelectorKind::Fifo, 10)).unwrap();
    let shared = chunk(100, 1);
    let weak: Weak<Chunk> = Arc::downgrade(&shared);
    a.try_insert(item(1, vec![shared.clone()]), 1.0).unwrap();
    b.try_insert(item(2, vec![shared.clone()]), 1.0).unwrap();
    drop(shared);
    assert_eq!(weak.strong_count(), 2);
    // Evict from table a: the chunk stays for table b.
    insert(&a, 3, 1.0);
    assert_eq!(weak.strong_count(), 1);
    // A sample in flight keeps it alive past deletion.
    let sampled = b.try_sample(1, usize::MAX);
    b.mutate_items(&[], &[2]).unwrap();
    assert!(weak.upgrade().is_some());
    drop(sampled);
    assert!(
        weak.upgrade().is_none(),
        "freed when the last reference is gone"
    );
}

#[test]
fn episode_counters() {
    let t = Table::new(config(SelectorKind::Uniform, SelectorKind::Fifo, 10)).unwrap();
    t.try_insert(item(1, vec![chunk(1, 7), chunk(2, 7)]), 1.0)
        .unwrap();
    t.try_insert(item(2, vec![chunk(3, 7)]), 1.0).unwrap();
    t.try_insert(item(3, vec![chunk(4, 8)]), 1.0).unwrap();
    assert_eq!(t.info().num_episodes, 2);
    t.mutate_items(&[], &[1]).unwrap();
    assert_eq!(
        (t.info().num_episodes, t.info().num_deleted_episodes),
        (2, 0)
    );
    t.mutate_items(&[], &[2, 3, 999]).unwrap();
    assert_eq!(
        (t.info().num_episodes, t.info().num_deleted_episodes),
        (0, 2)
    );
    t.reset();
    let info = t.info();
    assert_eq!((info.num_deleted_episodes, info.current_size), (0, 0));
    assert_eq!(
        info.rate_limiter_info
            .unwrap()
            .insert_stats
            .unwrap()
            .completed,
        0
    );
}

#[test]
fn mutate_checks_priorities_before_changing_anything() {
    let t = Table::new(config(
        SelectorKind::Prioritized {
            priority_exponent: 1.0,
        },
        SelectorKind::Fifo,
        10,
    ))
    .unwrap();
    insert(&t, 1, 1.0);
    insert(&t, 2, 1.0);
    assert!(t.mutate_items(&[(1, 3.0), (2, -1.0)], &[]).is_err());
    assert_eq!(t.get(1).unwrap().1, 1.0);
    assert!(t.try_insert(item(3, vec![]), f64::NAN).is_err());
    assert_eq!(t.size(), 2);
    t.mutate_items(&[(1, 3.0), (77, 1.0)], &[]).unwrap();
    assert_eq!(t.get(1).unwrap().1, 3.0);
}

/// A priority whose weight (`priority ^ exponent`) is too large to sum is refused, before
/// anything changes: the sum tree would become infinite and every probability NaN.
#[test]
fn priorities_whose_weight_overflows_are_refused() {
    let t = Table::with_seed(
        config(
            SelectorKind::Prioritized {
                priority_exponent: 2.0,
            },
            SelectorKind::Fifo,
            10,
        ),
        1,
    )
    .unwrap();
    insert(&t, 1, 1.0);
    insert(&t, 2, 1e148); // weight 1e296: taken
    let err = t
        .try_insert(item(3, vec![]), 1e150)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Priority 1e150") && err.contains("priority_exponent"),
        "{err}"
    );
    assert!(t.mutate_items(&[(1, 1e200)], &[]).is_err());
    assert_eq!((t.size(), t.get(1).unwrap().1), (2, 1.0));
    // Sampling still works, with a finite probability.
    for sampled in t.try_sample(8, usize::MAX) {
        assert!(sampled.probability.is_finite() && sampled.probability > 0.0);
    }
    // On a uniform table the same priority is only a number.
    let u = Table::new(config(SelectorKind::Uniform, SelectorKind::Fifo, 10)).unwrap();
    insert(&u, 1, 1e300);
    assert_eq!(u.size(), 1);
}

#[test]
fn rejects_bad_config() {
    let mut c = config(SelectorKind::Uniform, SelectorKind::Fifo, 0);
    assert!(Table::new(c.clone()).is_err());
    c.max_size = 1;
    c.name = String::new();
    assert!(Table::new(c).is_err());
}

#[test]
fn a_table_stamps_items_with_the_time_it_stored_them() {
    let t = Table::with_seed(config(SelectorKind::Uniform, SelectorKind::Fifo, 10), 1).unwrap();
    // Whatever time the writer sent (here the year 3000), as the reference does.
    let mut sent = item(1, vec![chunk(1, 1)]);
    sent.set_inserted_at(&prost_types::Timestamp {
        seconds: 32_503_680_000,
        nanos: 5,
    });
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(matches!(
        t.try_insert(sent, 1.0).unwrap(),
        InsertOutcome::Inserted
    ));
    let (stored, _, _) = t.get(1).unwrap();
    let at = stored.inserted_at().unwrap();
    assert!((before..before + 60).contains(&at.seconds), "{at:?}");
}

/// What a model of a table knows: each key's priority, times sampled and insertion order.
#[derive(Default)]
struct Model {
    items: Vec<(u64, f64, i32)>,
}

impl Model {
    fn find(&self, key: u64) -> Option<usize> {
        self.items.iter().position(|e| e.0 == key)
    }
}

proptest::proptest! {
    // Whatever mix of inserts, updates, deletes, evictions and samples (with
    // max_times_sampled) a table goes through, with any sampler and remover, it holds exactly
    // the model's items with their priorities and sample counts, samples only those with the
    // probability its sampler gives them, and evicts the model's oldest or newest item when
    // its remover is Fifo or Lifo. (The selectors find items by the places the table keeps
    // for them: a place left stale after a move would lose or mix up items here.)
    #[test]
    fn a_table_holds_exactly_its_items(
        pair in 0usize..8,
        ops in proptest::collection::vec((0u8..4, 0u64..24, 0u32..4), 1..300),
    ) {
        use SelectorKind::*;
        let prioritized = Prioritized { priority_exponent: 1.0 };
        let (sampler, remover) = [
            (Uniform, Fifo), (prioritized, Fifo), (Uniform, Uniform), (prioritized, Uniform),
            (Uniform, prioritized), (MaxHeap, Lifo), (prioritized, MinHeap), (Lifo, prioritized),
        ][pair];
        let mut c = config(sampler, remover, 12);
        c.max_times_sampled = 3;
        let t = Table::with_seed(c, 1).unwrap();
        let mut m = Model::default();
        for (op, key, p) in ops {
            let priority = 1.0 + p as f64;
            match op {
                0 => {
                    let outcome = t.try_insert(item(key, vec![chunk(key, key)]), priority).unwrap();
                    match m.find(key) {
                        Some(i) => {
                            proptest::prop_assert!(matches!(outcome, InsertOutcome::Updated));
                            m.items[i].1 = priority;
                        }
                        None => {
                            proptest::prop_assert!(matches!(outcome, InsertOutcome::Inserted));
                            m.items.push((key, priority, 0));
                            if m.items.len() > 12 {
                                let gone: Vec<usize> = (0..m.items.len())
                                    .filter(|&i| t.get(m.items[i].0).is_none())
                                    .collect();
                                proptest::prop_assert_eq!(gone.len(), 1);
                                match remover {
                                    Fifo => proptest::prop_assert_eq!(gone[0], 0),
                                    Lifo => proptest::prop_assert_eq!(gone[0], 12),
                                    _ => {}
                                }
                                m.items.remove(gone[0]);
                            }
                        }
                    }
                }
                1 => {
                    t.mutate_items(&[(key, priority)], &[]).unwrap();
                    if let Some(i) = m.find(key) {
                        m.items[i].1 = priority;
                    }
                }
                2 => {
                    t.mutate_items(&[], &[key]).unwrap();
                    if let Some(i) = m.find(key) {
                        m.items.remove(i);
                    }
                }
                _ => {
                    let total: f64 = m.items.iter().map(|e| e.1).sum();
                    for s in t.try_sample(1, usize::MAX) {
                        let i = m.find(s.item.key);
                        proptest::prop_assert!(i.is_some(), "sampled {} not held", s.item.key);
                        let i = i.unwrap();
                        let expect = match sampler {
                            Uniform => 1.0 / m.items.len() as f64,
                            Prioritized { .. } => m.items[i].1 / total,
                            _ => 1.0,
                        };
                        proptest::prop_assert!((s.probability - expect).abs() < 1e-9);
                        m.items[i].2 += 1;
                        proptest::prop_assert_eq!(s.times_sampled, m.items[i].2);
                        if m.items[i].2 == 3 {
                            m.items.remove(i);
                        }
                    }
                }
            }
            proptest::prop_assert_eq!(t.size(), m.items.len());
            for &(key, priority, times) in &m.items {
                let got = t.get(key);
                proptest::prop_assert!(got.is_some(), "item {} lost", key);
                let (_, p, n) = got.unwrap();
                proptest::prop_assert_eq!((p, n), (priority, times));
            }
            let weight: f64 = match sampler {
                Prioritized { .. } => m.items.iter().map(|e| e.1).sum(),
                _ => m.items.len() as f64,
            };
            let got = t.info().sampler_total_weight.unwrap();
            proptest::prop_assert!((got - weight).abs() < 1e-9, "weight {} vs {}", got, weight);
        }
    }
}

#[test]
fn insert_many_takes_what_the_limiter_allows_in_order_and_evicts_as_single_inserts_do() {
    let c = queue(3, 2);
    let t = Table::new(c).unwrap();
    let shared = chunk(1, 7);
    let mut items: std::collections::VecDeque<(ItemData, f64)> = (10..15)
        .map(|key| (item(key, vec![shared.clone()]), key as f64))
        .collect();
    assert_eq!(t.try_insert_many(&mut items).unwrap(), 2);
    assert_eq!(items.front().map(|(i, _)| i.key), Some(12));
    assert_eq!(t.try_insert_many(&mut items).unwrap(), 0, "still blocked");
    assert_eq!(t.try_sample(1, usize::MAX)[0].item.key, 10);
    assert_eq!(t.try_insert_many(&mut items).unwrap(), 1);
    let keys: Vec<u64> = t
        .try_sample(5, usize::MAX)
        .iter()
        .map(|s| s.item.key)
        .collect();
    assert_eq!(keys, [11, 12]);
    assert_eq!(t.try_insert_many(&mut items).unwrap(), 2);
    assert!(items.is_empty());
    let info = t.info();
    assert_eq!((info.current_size, info.num_episodes), (2, 1));

    // Without a limiter in the way: over max_size the remover evicts after each insert.
    let t = Table::new(config(SelectorKind::Fifo, SelectorKind::Fifo, 3)).unwrap();
    let mut items: std::collections::VecDeque<(ItemData, f64)> = (0..5)
        .map(|key| (item(key, vec![chunk(key, key)]), 1.0))
        .collect();
    assert_eq!(t.try_insert_many(&mut items).unwrap(), 5);
    let held = |t: &Table| -> Vec<(u64, f64)> {
        let items = t.snapshot().items;
        items.iter().map(|(i, p, _)| (i.key, *p)).collect()
    };
    assert_eq!(held(&t), [(2, 1.0), (3, 1.0), (4, 1.0)]);
    // A key already held only has its priority updated.
    let mut again = std::collections::VecDeque::from([(item(4, vec![chunk(4, 4)]), 9.0)]);
    assert_eq!(t.try_insert_many(&mut again).unwrap(), 1);
    assert_eq!(held(&t), [(2, 1.0), (3, 1.0), (4, 9.0)]);
}

proptest::proptest! {
    // A batch drawn in one call is what as many single draws give (same seed, same items):
    // the same items with the same values, and the same table after, whether the batch's
    // items stay (taken after drawing) or reach max_times_sampled inside it.
    #[test]
    fn a_batch_is_what_single_draws_give(
        pair in 0usize..4,
        max_times in 0i32..3,
        items in 1u64..40,
        batches in proptest::collection::vec(1usize..64, 1..6),
    ) {
        use SelectorKind::*;
        let prioritized = Prioritized { priority_exponent: 0.8 };
        let (sampler, remover) =
            [(Uniform, Fifo), (prioritized, Fifo), (Fifo, Fifo), (MaxHeap, prioritized)][pair];
        let mut c = config(sampler, remover, 100);
        c.max_times_sampled = max_times;
        let (batched, single) = (Table::with_seed(c.clone(), 7).unwrap(), Table::with_seed(c, 7).unwrap());
        for key in 1..=items {
            insert(&batched, key, key as f64);
            insert(&single, key, key as f64);
        }
        for n in batches {
            let got = batched.try_sample(n, usize::MAX);
            let want: Vec<SampledItem> =
                (0..n).flat_map(|_| single.try_sample(1, usize::MAX)).collect();
            let values = |s: &[SampledItem]| -> Vec<(u64, f64, i32, f64, i64)> {
                s.iter()
                    .map(|s| (s.item.key, s.priority, s.times_sampled, s.probability, s.table_size))
                    .collect()
            };
            proptest::prop_assert_eq!(values(&got), values(&want));
            proptest::prop_assert_eq!(batched.size(), single.size());
            let (a, b) = (batched.info(), single.info());
            proptest::prop_assert_eq!(a.num_unique_samples, b.num_unique_samples);
            proptest::prop_assert_eq!(a.rate_limiter_info, b.rate_limiter_info);
            // Priorities of the drawn items changed in one call, or one call per key.
            let updates: Vec<(u64, f64)> =
                got.iter().map(|s| (s.item.key, (s.item.key % 5) as f64 + 0.5)).collect();
            batched.mutate_items(&updates, &[]).unwrap();
            for &update in &updates {
                single.mutate_items(&[update], &[]).unwrap();
            }
            proptest::prop_assert_eq!(batched.info().sampler_total_weight, single.info().sampler_total_weight);
        }
    }
}
