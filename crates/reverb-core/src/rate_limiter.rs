//! The rate limiter: decides when inserts and samples may proceed, with the reference's exact
//! inequalities (see `shared/reference/reverb-behaviour.md` §1.4).

use crate::{invalid_arg, Result};
use reverb_proto::{RateLimiterCallStats, RateLimiterInfo};

/// Static settings of a rate limiter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimiterConfig {
    /// Samples allowed per insert, on average.
    pub samples_per_insert: f64,
    /// Items the table must hold before any sample is allowed.
    pub min_size_to_sample: i64,
    /// Lower bound of `inserts * samples_per_insert - samples` for a sample to go ahead.
    pub min_diff: f64,
    /// Upper bound of `inserts * samples_per_insert - samples` for an insert to go ahead.
    pub max_diff: f64,
}

impl RateLimiterConfig {
    /// The reference's `MinSize`: samples once the table holds `min_size` items, inserts
    /// always.
    pub fn min_size(min_size: i64) -> Self {
        Self {
            samples_per_insert: 1.0,
            min_size_to_sample: min_size,
            min_diff: -f64::MAX,
            max_diff: f64::MAX,
        }
    }

    /// Checks the settings the reference checks (`min_size_to_sample > 0`, `samples_per_insert > 0`).
    pub fn validate(&self) -> Result<()> {
        if self.min_size_to_sample < 1 {
            return Err(invalid_arg!(
                "min_size_to_sample must be >= 1, got {}",
                self.min_size_to_sample
            ));
        }
        if self.samples_per_insert.is_nan() || self.samples_per_insert <= 0.0 {
            return Err(invalid_arg!(
                "samples_per_insert must be > 0, got {}",
                self.samples_per_insert
            ));
        }
        if self.min_diff.is_nan() || self.max_diff.is_nan() || self.min_diff > self.max_diff {
            return Err(invalid_arg!(
                "min_diff ({}) must be <= max_diff ({})",
                self.min_diff,
                self.max_diff
            ));
        }
        Ok(())
    }
}

/// Counters plus settings. Not thread-safe: the table holds it under its lock.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimiter {
    config: RateLimiterConfig,
    inserts: i64,
    samples: i64,
    deletes: i64,
}

impl RateLimiter {
    /// A limiter with zeroed counters.
    pub fn new(config: RateLimiterConfig) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            config,
            inserts: 0,
            samples: 0,
            deletes: 0,
        })
    }

    /// The static settings.
    pub fn config(&self) -> &RateLimiterConfig {
        &self.config
    }

    /// Whether `n` more samples may be taken now.
    pub fn can_sample(&self, n: i64) -> bool {
        if self.inserts - self.deletes < self.config.min_size_to_sample {
            return false;
        }
        self.inserts as f64 * self.config.samples_per_insert - self.samples as f64 - n as f64
            >= self.config.min_diff
    }

    /// Whether `n` more items may be inserted now.
    pub fn can_insert(&self, n: i64) -> bool {
        if self.inserts + n - self.deletes <= self.config.min_size_to_sample {
            return true;
        }
        (self.inserts + n) as f64 * self.config.samples_per_insert - self.samples as f64
            <= self.config.max_diff
    }

    /// Records one insert.
    pub fn insert(&mut self) {
        self.inserts += 1;
    }

    /// Records one sample.
    pub fn sample(&mut self) {
        self.samples += 1;
    }

    /// Records one deletion.
    pub fn delete(&mut self) {
        self.deletes += 1;
    }

    /// Zeroes every counter.
    pub fn reset(&mut self) {
        self.inserts = 0;
        self.samples = 0;
        self.deletes = 0;
    }

    /// `(inserts, samples, deletes)`.
    pub fn counters(&self) -> (i64, i64, i64) {
        (self.inserts, self.samples, self.deletes)
    }

    /// Restores counters (checkpoint load).
    pub fn set_counters(&mut self, inserts: i64, samples: i64, deletes: i64) {
        self.inserts = inserts;
        self.samples = samples;
        self.deletes = deletes;
    }

    /// The `RateLimiterInfo` reported in `TableInfo`.
    pub fn info(&self) -> RateLimiterInfo {
        RateLimiterInfo {
            samples_per_insert: self.config.samples_per_insert,
            min_diff: self.config.min_diff,
            max_diff: self.config.max_diff,
            min_size_to_sample: self.config.min_size_to_sample,
            insert_stats: Some(RateLimiterCallStats {
                completed: self.inserts,
            }),
            sample_stats: Some(RateLimiterCallStats {
                completed: self.samples,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limiter(spi: f64, min_size: i64, min_diff: f64, max_diff: f64) -> RateLimiter {
        RateLimiter::new(RateLimiterConfig {
            samples_per_insert: spi,
            min_size_to_sample: min_size,
            min_diff,
            max_diff,
        })
        .unwrap()
    }

    #[test]
    fn rejects_invalid_settings() {
        let ok = RateLimiterConfig {
            samples_per_insert: 1.0,
            min_size_to_sample: 1,
            min_diff: 0.0,
            max_diff: 1.0,
        };
        assert!(RateLimiter::new(RateLimiterConfig {
            min_size_to_sample: 0,
            ..ok
        })
        .is_err());
        assert!(RateLimiter::new(RateLimiterConfig {
            samples_per_insert: 0.0,
            ..ok
        })
        .is_err());
        assert!(RateLimiter::new(RateLimiterConfig {
            min_diff: 2.0,
            ..ok
        })
        .is_err());
    }

    #[test]
    fn queue_semantics() {
        // Queue(3): spi=1, min_size=1, min_diff=0, max_diff=3.
        let mut r = limiter(1.0, 1, 0.0, 3.0);
        assert!(!r.can_sample(1));
        for _ in 0..3 {
            assert!(r.can_insert(1));
            r.insert();
        }
        assert!(!r.can_insert(1), "a full queue blocks inserts");
        assert!(r.can_sample(3));
        assert!(!r.can_sample(4));
        r.sample();
        r.delete();
        assert!(r.can_insert(1));
    }

    #[test]
    fn sample_to_insert_ratio_example() {
        // SampleToInsertRatio(2, 10, 5) -> min_diff 15, max_diff 25.
        let mut r = limiter(2.0, 10, 15.0, 25.0);
        for _ in 0..10 {
            assert!(r.can_insert(1));
            r.insert();
        }
        // 10 inserts: 20 - samples - 1 >= 15 allows 4 samples.
        let mut taken = 0;
        while r.can_sample(1) {
            r.sample();
            taken += 1;
        }
        assert_eq!(taken, 5);
        // (11)*2 - 5 = 17 <= 25
        assert!(r.can_insert(1));
        // 14 inserts -> 28 - 5 = 23 <= 25; 15 -> 30-5=25 ok; 16 -> 27 > 25 blocks
        for _ in 0..5 {
            r.insert();
        }
        assert!(!r.can_insert(1));
    }

    proptest! {
        // The limiter answers exactly the reference inequalities for any counter state.
        #[test]
        fn inequalities_hold(
            spi in 0.1f64..8.0, min_size in 1i64..20, lo in -50.0f64..50.0, width in 0.0f64..100.0,
            inserts in 0i64..200, samples in 0i64..400, deletes_frac in 0.0f64..1.0, n in 1i64..10,
        ) {
            let deletes = (inserts as f64 * deletes_frac) as i64;
            let mut r = limiter(spi, min_size, lo, lo + width);
            r.set_counters(inserts, samples, deletes);
            let expect_sample = inserts - deletes >= min_size
                && inserts as f64 * spi - samples as f64 - n as f64 >= lo;
            let expect_insert = inserts + n - deletes <= min_size
                || (inserts + n) as f64 * spi - samples as f64 <= lo + width;
            prop_assert_eq!(r.can_sample(n), expect_sample);
            prop_assert_eq!(r.can_insert(n), expect_insert);
        }

        // Driving inserts and samples only when allowed keeps the table in the allowed band.
        #[test]
        fn stays_within_band(ops in proptest::collection::vec(any::<bool>(), 1..300), spi in 0.5f64..4.0) {
            let min_size = 3;
            let eb = 2.0 * spi.max(1.0) + 1.0;
            let offset = spi * min_size as f64;
            let mut r = limiter(spi, min_size, offset - eb, offset + eb);
            for insert in ops {
                if insert && r.can_insert(1) { r.insert(); }
                if !insert && r.can_sample(1) { r.sample(); }
                let (i, s, _) = r.counters();
                if i > min_size {
                    prop_assert!(i as f64 * spi - s as f64 <= offset + eb + spi);
                }
                if s > 0 {
                    prop_assert!(i as f64 * spi - s as f64 >= offset - eb - 1.0);
                }
            }
        }
    }
}
