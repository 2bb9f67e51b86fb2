//! Several servers used as one (`reverb.ShardedClient`): item keys that name the shard that
//! holds them, and the weights a client draws shards by so that samples follow the global
//! distribution (the sharded sampler itself is `sampler::shards`). A leaf: it knows tables'
//! infos and keys, not clients or samplers.

use reverb_proto::key_distribution_options::Distribution;
use reverb_proto::TableInfo;

/// The most shards a sharded client spreads its writes over (the shard index is 6 bits of
/// the item key).
pub const MAX_SHARDS: usize = 64;

/// The top 6 bits of an item key written through a sharded client; the next 6 bits are the
/// shard index and the low 52 bits random. A key without this mark (e.g. written by a plain
/// client) is of unknown origin.
const MARK: u64 = 0b10_1101;

/// `random` with its top 12 bits replaced by the mark and `shard`.
pub fn tag_key(random: u64, shard: u8) -> u64 {
    debug_assert!((shard as usize) < MAX_SHARDS);
    (MARK << 58) | ((shard as u64 & 0x3f) << 52) | (random & ((1 << 52) - 1))
}

/// The shard a key written through a sharded client names; `None` for other keys.
pub fn key_shard(key: u64) -> Option<u8> {
    (key >> 58 == MARK).then_some(((key >> 52) & 0x3f) as u8)
}

/// What a sharded client knows of one shard's table: its size and the total weight its
/// sampler draws by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardWeight {
    /// Items in the table.
    pub size: i64,
    /// The sum of the sampler's item weights (an item's probability on its shard is its
    /// weight over this). Servers that do not report it (the reference's) count as uniform:
    /// their size.
    pub total_weight: f64,
    /// Whether its rate limiter refuses a sample now (it waits for inserts).
    pub sampling_blocked: bool,
    /// Whether sampling deletes items (`max_times_sampled`, e.g. queues).
    pub sampling_deletes: bool,
}

impl ShardWeight {
    /// The weight of `table` as a server's `ServerInfo` describes it; `None` if it has no
    /// such table.
    pub fn of(infos: &[TableInfo], table: &str) -> Option<Self> {
        let info = infos.iter().find(|i| i.name == table)?;
        // The limiter's test for one more sample (its counters are in `rate_limiter_info`).
        let sampling_blocked = info.rate_limiter_info.as_ref().is_some_and(|l| {
            let inserts = l.insert_stats.as_ref().map_or(0, |s| s.completed) as f64;
            let samples = l.sample_stats.as_ref().map_or(0, |s| s.completed) as f64;
            info.current_size < l.min_size_to_sample
                || inserts * l.samples_per_insert - samples - 1.0 < l.min_diff
        });
        Some(Self {
            size: info.current_size,
            total_weight: info
                .sampler_total_weight
                .unwrap_or(info.current_size as f64),
            sampling_blocked,
            sampling_deletes: info.max_times_sampled > 0,
        })
    }
}

/// Whether `info`'s sampler draws in a fixed order (FIFO, LIFO, heaps): across shards such
/// tables are drawn by size, and their order holds only within a shard.
pub fn is_ordered(info: &TableInfo) -> bool {
    matches!(
        info.sampler_options
            .as_ref()
            .and_then(|o| o.distribution.as_ref()),
        Some(Distribution::Fifo(_) | Distribution::Lifo(_) | Distribution::Heap(_))
    )
}

/// The weights shards are drawn by: their sampler totals, or, when every total is 0 (only
/// zero priorities, which the prioritized sampler then draws uniformly), their sizes.
/// Unknown shards (unreachable, or without the table) weigh 0.
pub fn draw_weights(shards: &[Option<ShardWeight>]) -> Vec<f64> {
    let totals: Vec<f64> = shards
        .iter()
        .map(|w| w.map_or(0.0, |w| w.total_weight.max(0.0)))
        .collect();
    if totals.iter().any(|&t| t > 0.0) {
        return totals;
    }
    shards
        .iter()
        .map(|w| w.map_or(0.0, |w| w.size.max(0) as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Client;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn tagged_keys_name_their_shard(random: u64, shard in 0u8..64) {
            let key = tag_key(random, shard);
            prop_assert_eq!(key_shard(key), Some(shard));
            prop_assert_eq!(key & ((1 << 52) - 1), random & ((1 << 52) - 1));
        }

        #[test]
        fn only_marked_keys_name_a_shard(key: u64) {
            prop_assert_eq!(key_shard(key).is_some(), key >> 58 == MARK);
        }
    }

    #[test]
    fn weights_fall_back_to_sizes_when_every_total_is_zero() {
        let w = |size, total_weight| {
            Some(ShardWeight {
                size,
                total_weight,
                sampling_blocked: false,
                sampling_deletes: false,
            })
        };
        assert_eq!(draw_weights(&[w(3, 1.5), None, w(2, 0.0)]), [1.5, 0.0, 0.0]);
        assert_eq!(draw_weights(&[w(3, 0.0), None, w(2, 0.0)]), [3.0, 0.0, 2.0]);
        let info = TableInfo {
            name: "t".into(),
            current_size: 7,
            ..Default::default()
        };
        assert_eq!(
            ShardWeight::of(std::slice::from_ref(&info), "t"),
            Some(ShardWeight {
                size: 7,
                total_weight: 7.0,
                sampling_blocked: false,
                sampling_deletes: false,
            })
        );
        assert_eq!(ShardWeight::of(&[info], "u"), None);
    }

    #[test]
    fn clients_write_keys_that_name_their_shard_or_none() {
        let plain = Client::new("localhost:1").unwrap();
        let sharded = plain.clone().with_key_shard(Some(5)).unwrap();
        for _ in 0..10_000 {
            assert_eq!(key_shard(plain.new_item_key()), None);
            assert_eq!(key_shard(sharded.new_item_key()), Some(5));
        }
        assert!(plain.with_key_shard(Some(MAX_SHARDS)).is_err());
    }

    #[test]
    fn a_limiter_that_waits_for_inserts_blocks_sampling() {
        use reverb_proto::{RateLimiterCallStats, RateLimiterInfo};
        // SampleToInsertRatio(2, min_size 1, error_buffer 2): min_diff = 0.
        let info = |size, inserts, samples| TableInfo {
            name: "t".into(),
            current_size: size,
            max_times_sampled: 1,
            rate_limiter_info: Some(RateLimiterInfo {
                samples_per_insert: 2.0,
                min_diff: 0.0,
                max_diff: 4.0,
                min_size_to_sample: 1,
                insert_stats: Some(RateLimiterCallStats { completed: inserts }),
                sample_stats: Some(RateLimiterCallStats { completed: samples }),
            }),
            ..Default::default()
        };
        let blocked = |size, inserts, samples| {
            let weight = ShardWeight::of(&[info(size, inserts, samples)], "t").unwrap();
            assert!(weight.sampling_deletes);
            weight.sampling_blocked
        };
        assert!(blocked(0, 0, 0)); // below min_size
        assert!(!blocked(3, 3, 5)); // 3 * 2 - 5 - 1 >= 0
        assert!(blocked(3, 3, 6)); // one more would go below min_diff
    }
}
