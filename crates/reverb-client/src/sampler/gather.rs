//! A batch of samples a server of this process holds in place, gathered column by column
//! straight from the chunks as stored ([`reverb_proto::gather`]).

use super::Batch;
use crate::{ClientError, Result, Tensor};
use reverb_proto::gather::GatherError;
use reverb_proto::held::HeldSample;

pub use reverb_proto::gather::DecodedCache;

impl From<GatherError> for ClientError {
    fn from(e: GatherError) -> Self {
        match e {
            GatherError::Invalid(m) => ClientError::invalid(m),
            GatherError::DataLoss(m) => ClientError::data_loss(m),
        }
    }
}

/// The batch of `samples` gathered from their chunks; `Ok(None)` when one of them holds
/// what only the message path reads (strings, delta encoding, tensors the scan does not
/// read): the caller then plans them.
pub(super) fn gather(samples: &[HeldSample], cache: &mut DecodedCache) -> Result<Option<Batch>> {
    Ok(reverb_proto::gather::gather(samples, cache)?.map(Batch::from))
}

impl From<reverb_proto::gather::Batch> for Batch {
    fn from(b: reverb_proto::gather::Batch) -> Self {
        Batch {
            info: b.info,
            columns: b
                .columns
                .into_iter()
                .map(|c| Tensor {
                    dtype: c.dtype,
                    shape: c.shape,
                    data: c.data,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{stack, stack_planned, Batch};
    use super::DecodedCache;
    use crate::sample::{plan, Columns, Sampled};
    use crate::tensor::{encode_chunk_with, encode_strings, Tensor, DT_STRING};
    use proptest::prelude::*;
    use reverb_core::chunk::{Chunk, ItemData};
    use reverb_core::{Draw, RateLimiterConfig, SelectorKind, Table, TableConfig};
    use reverb_proto::flat_trajectory::{ChunkSlice, Column};
    use reverb_proto::held::HeldSample;
    use reverb_proto::SampleBatch;
    use reverb_proto::{FlatTrajectory, SequenceRange};
    use std::sync::Arc;

    /// Chunk `i` of an episode: `rows` rows from row `start`; tensor 0 is int32 `[rows, 3]`,
    /// tensor 1 uint8 `[rows, 5]`; `noisy` data does not compress, the rest does.
    fn chunk(i: usize, start: i32, rows: usize, noisy: bool, delta: bool) -> Chunk {
        let value = |r: usize, j: usize| {
            if noisy {
                ((i * 7919 + r * 104_729 + j * 31) % 251) as i32
            } else {
                (start as usize + r) as i32
            }
        };
        let ints = (0..rows)
            .flat_map(|r| (0..3).map(move |j| value(r, j)))
            .flat_map(i32::to_le_bytes)
            .collect();
        let bytes = (0..rows)
            .flat_map(|r| (0..5).map(move |j| value(r, j + 3) as u8))
            .collect();
        let tensors = [
            Tensor::new(3, vec![rows as i64, 3], ints).unwrap(),
            Tensor::new(4, vec![rows as i64, 5], bytes).unwrap(),
        ];
        let range = SequenceRange {
            episode_id: 1,
            start,
            end: start + rows as i32 - 1,
            sparse: false,
        };
        Chunk::new(encode_chunk_with(100 + i as u64, range, &tensors, delta))
    }

    /// An item of `lengths[c]` rows of tensor `c` for each column, from episode row
    /// `starts[c]`, over `chunks` (consecutive, `rows` each).
    fn item(
        key: u64,
        chunks: &[Arc<Chunk>],
        rows: &[usize],
        columns: &[(usize, usize, bool)],
    ) -> HeldSample {
        HeldSample {
            item: Arc::new(item_data(key, chunks, rows, columns)),
            table: "t".into(),
            priority: key as f64 / 2.0,
            times_sampled: key as i32,
            probability: 1.0 / (key as f64 + 1.0),
            table_size: 10,
        }
    }

    /// The item of [`item`].
    fn item_data(
        key: u64,
        chunks: &[Arc<Chunk>],
        rows: &[usize],
        columns: &[(usize, usize, bool)],
    ) -> ItemData {
        let mut used: Vec<Arc<Chunk>> = Vec::new();
        let mut trajectory = FlatTrajectory::default();
        for (index, &(start, length, squeeze)) in columns.iter().enumerate() {
            let mut slices = Vec::new();
            let (mut at, mut left) = (start, length);
            let mut first = 0;
            for (c, &r) in rows.iter().enumerate() {
                if left > 0 && at < first + r {
                    let offset = at - first;
                    let take = left.min(r - offset);
                    slices.push(ChunkSlice {
                        chunk_key: chunks[c].key(),
                        offset: offset as i32,
                        length: take as i32,
                        index: index as i32,
                    });
                    if !used.iter().any(|u| Arc::ptr_eq(u, &chunks[c])) {
                        used.push(chunks[c].clone());
                    }
                    at += take;
                    left -= take;
                }
                first += r;
            }
            trajectory.columns.push(Column {
                chunk_slices: slices,
                squeeze,
            });
        }
        ItemData::new(key, &trajectory, used).unwrap()
    }

    fn planned(samples: &[HeldSample]) -> crate::Result<Batch> {
        let planned = samples
            .iter()
            .map(|s| {
                let (info, chunks) = s.to_wire();
                plan(info, &chunks)
            })
            .collect::<crate::Result<Vec<_>>>()?;
        stack_planned(planned)
    }

    fn same(a: &Batch, b: &Batch) {
        assert_eq!(a.info, b.info);
        assert_eq!(a.columns.len(), b.columns.len());
        for (x, y) in a.columns.iter().zip(&b.columns) {
            assert_eq!((x.dtype, &x.shape), (y.dtype, &y.shape));
            assert_eq!(x.data, y.data);
        }
    }

    proptest! {
        /// A batch gathered from the chunks as stored equals the same samples planned from
        /// their wire form and stacked: chunks shared between samples, slices across chunk
        /// boundaries (runs), partial and whole tensors, stored and compressed, delta encoded
        /// (not gathered), squeezed columns.
        #[test]
        fn gathered_batches_equal_planned_ones(
            chunks in proptest::collection::vec((1usize..5, any::<bool>()), 1..5),
            delta in any::<bool>(),
            lengths in (1usize..4, 1usize..4),
            squeeze in any::<bool>(),
            starts in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let rows: Vec<usize> = chunks.iter().map(|c| c.0).collect();
            let total: usize = rows.iter().sum();
            let (a, b) = (lengths.0.min(total), lengths.1.min(total));
            let mut start = 0;
            let stored: Vec<Arc<Chunk>> = chunks
                .iter()
                .enumerate()
                .map(|(i, &(r, noisy))| {
                    let c = Arc::new(chunk(i, start as i32, r, noisy, delta));
                    start += r;
                    c
                })
                .collect();
            let samples: Vec<HeldSample> = starts
                .iter()
                .enumerate()
                .map(|(k, (x, y))| {
                    let columns = [
                        (x.index(total - a + 1), a, false),
                        (y.index(total - b + 1), b, squeeze && b == 1),
                    ];
                    item(k as u64 + 1, &stored, &rows, &columns)
                })
                .collect();
            let expected = planned(&samples).unwrap();
            // (A small cache: trimmed between the batches; the second batch reads what the
            // first kept.)
            let mut cache = DecodedCache::with_budget(64);
            for _ in 0..2 {
                match super::gather(&samples, &mut cache).unwrap() {
                    Some(batch) => {
                        prop_assert!(!delta);
                        same(&batch, &expected);
                    }
                    None => prop_assert!(delta),
                }
                prop_assert!(cache.bytes() <= 64);
            }
            let through_stack =
                stack(samples.iter().cloned().map(Sampled::Held).collect(), &mut cache).unwrap();
            same(&through_stack, &expected);
            if !delta {
                // The same samples as they may arrive over gRPC: the first ones as rows of
                // one batch of columns, then every other one as rows of another, the rest
                // as they are; stacked, they are the same batch.
                let cut = cut.index(samples.len() + 1);
                let (head, tail) = samples.split_at(cut);
                let odd: Vec<HeldSample> = tail.iter().skip(1).step_by(2).cloned().collect();
                let mut first = as_rows(head, &mut cache).into_iter();
                let mut second = as_rows(&odd, &mut cache).into_iter();
                let mixed: Vec<Sampled> = (0..samples.len())
                    .map(|i| match i {
                        i if i < cut => first.next().unwrap(),
                        i if (i - cut) % 2 == 1 => second.next().unwrap(),
                        i => Sampled::Held(samples[i].clone()),
                    })
                    .collect();
                same(&stack(mixed, &mut cache).unwrap(), &expected);
            }
        }
    }

    /// A table of Uniform (or Prioritized) sampling, seeded.
    fn table(prioritized: bool) -> Table {
        let sampler = if prioritized {
            SelectorKind::Prioritized {
                priority_exponent: 0.8,
            }
        } else {
            SelectorKind::Uniform
        };
        let config = TableConfig {
            name: "t".into(),
            sampler,
            remover: SelectorKind::Fifo,
            max_size: 12,
            max_times_sampled: 0,
            rate_limiter: RateLimiterConfig::min_size(1),
            signature: None,
        };
        Table::with_seed(config, 7).unwrap()
    }

    proptest! {
        /// A batch of the rows a table keeps is the batch gathered from the same items'
        /// chunks (the same draws, values and columns): one-row items of shared chunks of
        /// several rows (items of a run), stored and compressed, squeezed or not, through
        /// evictions and deletes; a table stops keeping rows once an item of two rows comes,
        /// and keeps them again once emptied.
        #[test]
        fn rows_a_table_keeps_are_the_gathered_batch(
            chunks in proptest::collection::vec((1usize..5, any::<bool>()), 1..5),
            squeeze in (any::<bool>(), any::<bool>()),
            prioritized in any::<bool>(),
            ops in proptest::collection::vec((0u8..6, any::<prop::sample::Index>(), any::<prop::sample::Index>()), 1..40),
        ) {
            let rows: Vec<usize> = chunks.iter().map(|c| c.0).collect();
            let total: usize = rows.iter().sum();
            let mut start = 0;
            let stored: Vec<Arc<Chunk>> = chunks
                .iter()
                .enumerate()
                .map(|(i, &(r, noisy))| {
                    let c = Arc::new(chunk(i, start as i32, r, noisy, false));
                    start += r;
                    c
                })
                .collect();
            let (kept, plain) = (table(prioritized), table(prioritized));
            let mut wide = false; // an item of two rows is held
            let mut cache = DecodedCache::default();
            for (k, (op, x, y)) in ops.iter().enumerate() {
                let key = k as u64 + 1;
                match op {
                    0..=2 => {
                        let columns = [(x.index(total), 1, squeeze.0), (y.index(total), 1, squeeze.1)];
                        for t in [&kept, &plain] {
                            t.try_insert(item_data(key, &stored, &rows, &columns), key as f64).unwrap();
                        }
                    }
                    3 if total > 1 && !wide => {
                        let columns = [(x.index(total - 1), 2, false), (y.index(total), 1, squeeze.1)];
                        for t in [&kept, &plain] {
                            t.try_insert(item_data(key, &stored, &rows, &columns), 1.0).unwrap();
                        }
                        wide = true;
                    }
                    4 => {
                        let victim = x.index(key as usize) as u64;
                        for t in [&kept, &plain] {
                            t.mutate_items(&[], &[victim]).unwrap();
                        }
                        if kept.size() == 0 {
                            wide = false;
                        }
                    }
                    _ => {
                        let n = 1 + y.index(8);
                        let held = |items: Vec<reverb_core::SampledItem>| -> Vec<HeldSample> {
                            items.into_iter().map(HeldSample::from).collect()
                        };
                        let got = match kept.try_sample_rows(n) {
                            Some(Draw::Columns(batch)) => {
                                prop_assert!(!batch.info.is_empty() || kept.size() == 0);
                                Ok(Some(batch))
                            }
                            Some(Draw::Items(items)) => {
                                prop_assert!(wide, "items only once a two-row item is held");
                                reverb_proto::gather::gather(&held(items), &mut cache)
                            }
                            None => {
                                let empty = kept.size() == 0;
                                prop_assert!(wide || empty, "rows are kept while every item has one row");
                                reverb_proto::gather::gather(&held(kept.try_sample(n, usize::MAX)), &mut cache)
                            }
                        };
                        if kept.size() == 0 {
                            continue;
                        }
                        let want = reverb_proto::gather::gather(&held(plain.try_sample(n, usize::MAX)), &mut cache);
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }

    /// `samples` gathered and sent as columns, as a client receives them.
    fn as_rows(samples: &[HeldSample], cache: &mut DecodedCache) -> Vec<Sampled> {
        match reverb_proto::gather::gather(samples, cache).unwrap() {
            Some(batch) => Columns::rows(SampleBatch::from(batch)).unwrap(),
            None => Vec::new(),
        }
    }

    /// String columns are not gathered: the batch is planned, with the same result.
    #[test]
    fn string_columns_are_planned() {
        let words = ["a", "bb", "", "dddd"];
        let t = Tensor::new(
            DT_STRING,
            vec![4],
            encode_strings(words.iter().map(|w| w.as_bytes())),
        )
        .unwrap();
        let range = SequenceRange {
            episode_id: 1,
            start: 0,
            end: 3,
            sparse: false,
        };
        let stored = vec![Arc::new(Chunk::new(encode_chunk_with(
            9,
            range,
            &[t],
            false,
        )))];
        let samples: Vec<HeldSample> = (0..3)
            .map(|k| item(k + 1, &stored, &[4], &[(k as usize, 2, false)]))
            .collect();
        let cache = &mut DecodedCache::default();
        assert!(super::gather(&samples, cache).unwrap().is_none());
        let batch = stack(samples.iter().cloned().map(Sampled::Held).collect(), cache).unwrap();
        same(&batch, &planned(&samples).unwrap());
        assert_eq!(batch.columns[0].shape, vec![3, 2]);
    }

    /// Samples whose columns differ cannot be batched; a squeezed column of two rows and a
    /// column without slices are refused, not read.
    #[test]
    fn mismatched_and_malformed_batches_are_refused() {
        let stored: Vec<Arc<Chunk>> = (0..2)
            .map(|i| Arc::new(chunk(i, 4 * i as i32, 4, true, false)))
            .collect();
        let rows = [4, 4];
        let two = item(1, &stored, &rows, &[(0, 2, false), (0, 1, false)]);
        let three = item(2, &stored, &rows, &[(1, 3, false), (0, 1, false)]);
        let cache = &mut DecodedCache::default();
        let e = super::gather(&[two.clone(), three], cache).unwrap_err();
        let want = "differ in column 0 (dtypes int32 and int32, shapes [2, 3] and [3, 3])";
        assert!(e.message.contains(want), "{}", e.message);
        let squeezed = item(3, &stored, &rows, &[(0, 2, true), (0, 1, false)]);
        let e = super::gather(&[squeezed], cache).unwrap_err();
        assert!(
            e.message.contains("squeezed but has 2 rows"),
            "{}",
            e.message
        );
        let empty = item(4, &stored, &rows, &[(0, 0, false), (0, 1, false)]);
        let e = super::gather(&[empty], cache).unwrap_err();
        assert!(
            e.message.contains("Column 0 has no slices"),
            "{}",
            e.message
        );
        let e = super::gather(
            &[two.clone(), item(5, &stored, &rows, &[(0, 2, false)])],
            cache,
        )
        .unwrap_err();
        assert!(
            e.message.contains("different numbers of columns"),
            "{}",
            e.message
        );
        // One row squeezed in one sample, not in the other.
        let plain = item(6, &stored, &rows, &[(0, 2, false), (0, 1, false)]);
        let squeezed = item(7, &stored, &rows, &[(0, 2, false), (0, 1, true)]);
        let e = super::gather(&[plain, squeezed], cache).unwrap_err();
        assert!(
            e.message.contains("differ in column 1 (squeezed"),
            "{}",
            e.message
        );
        // Rows out of the chunk (a negative offset, as a checkpoint could hold): refused.
        let mut bad = FlatTrajectory::default();
        bad.columns.push(Column {
            chunk_slices: vec![ChunkSlice {
                chunk_key: stored[0].key(),
                offset: -1,
                length: 2,
                index: 0,
            }],
            squeeze: false,
        });
        let data = ItemData::new(8, &bad, vec![stored[0].clone()]).unwrap();
        let held = HeldSample {
            item: Arc::new(data),
            ..two
        };
        let e = super::gather(&[held], cache).unwrap_err();
        assert!(e.message.contains("slices rows"), "{}", e.message);
    }
}
