//! A batch of samples a server of this process holds in place, gathered column by column
//! straight from the chunks as stored: each slice's rows are copied from the tensor's stored
//! bytes (or decompressed into their place; a compressed tensor taken in part is decoded
//! whole once and kept for later batches in a [`DecodedCache`]), with no message, no
//! per-sample allocation and no decoded copy of chunks stored uncompressed.

use super::batch::batch_bytes;
use super::Batch;
use crate::tensor::stored_bytes;
use crate::{ClientError, Result, Tensor};
use reverb_proto::held::{HeldSample, StoredItem};
use reverb_proto::payload::{dtype_name, dtype_size, Layout, TensorScan};
use std::collections::HashMap;
use std::sync::Arc;

/// One slice of one sample's column: rows of a chunk tensor, read in place.
struct Part<'a> {
    /// The sample it belongs to.
    sample: usize,
    layout: Layout,
    /// The tensor's stored bytes (snappy data).
    content: &'a [u8],
    /// Its bytes once decompressed.
    len: usize,
    /// `(chunk key, tensor position)`: which tensor it is.
    tensor: (u64, usize),
    /// Where its chunk's payload is (while the sample holds the chunk, no other has it).
    payload: usize,
    offset: usize,
    length: usize,
}

impl Part<'_> {
    fn rows(&self) -> usize {
        self.layout.shape().first().map_or(1, |&d| d as usize)
    }

    /// Bytes of one row of its tensor (`None` if that overflows).
    fn row_bytes(&self) -> Option<usize> {
        let row_shape = self.layout.shape().get(1..).unwrap_or(&[]);
        row_shape
            .iter()
            .try_fold(dtype_size(self.layout.dtype).unwrap_or(0), |b, &d| {
                b.checked_mul(d as usize)
            })
    }
}

/// The batch of `samples` gathered from their chunks; `Ok(None)` when one of them holds
/// what only the message path reads (strings, delta encoding, tensors the scan does not
/// read): the caller then plans them.
pub(super) fn gather(samples: &[HeldSample], cache: &mut DecodedCache) -> Result<Option<Batch>> {
    let n = samples.len();
    let Some(first) = samples.first() else {
        return Ok(Some(Batch {
            info: Vec::new(),
            columns: Vec::new(),
        }));
    };
    warm(samples);
    let width = first.item.columns();
    let mut columns: Vec<Vec<Part<'_>>> = (0..width).map(|_| Vec::with_capacity(n)).collect();
    let mut squeezed = vec![false; width];
    // (A column's chunks mostly have tensors of one layout: read once.)
    let mut scans: Vec<TensorScan<'_>> = (0..width).map(|_| TensorScan::default()).collect();
    // A column squeezed in one sample and not in another (the first such).
    let mut squeeze_differs = None;
    for (i, sample) in samples.iter().enumerate() {
        let item = &*sample.item;
        if item.columns() != width {
            return Err(ClientError::invalid(format!(
                "Sampled items have different numbers of columns ({width} and {}): batch_size must be None",
                item.columns()
            )));
        }
        let mut readable = true;
        item.for_each_slice(&mut |s| {
            let chunk = item.chunk(s.chunk);
            let scanned = (!chunk.delta_encoded)
                .then(|| scans[s.column].scan(chunk.payload, s.index))
                .flatten();
            let Some((layout, content, len)) = scanned else {
                readable = false;
                return;
            };
            if i == 0 {
                squeezed[s.column] = s.squeeze;
            } else if squeezed[s.column] != s.squeeze {
                squeeze_differs.get_or_insert((s.column, i));
            }
            columns[s.column].push(Part {
                sample: i,
                layout,
                content,
                len,
                tensor: (chunk.key, s.index),
                payload: chunk.payload.as_ptr() as usize,
                offset: s.offset,
                length: s.length,
            });
        });
        if !readable {
            return Ok(None);
        }
    }
    if let Some((c, i)) = squeeze_differs {
        return Err(ClientError::invalid(format!(
            "Sampled items differ in column {c} (squeezed in the first, not in sample {i} or \
             the other way round): they cannot be batched"
        )));
    }
    warm_rows(&columns);
    let mut out = Vec::with_capacity(width);
    let mut decoder = snap::raw::Decoder::new();
    for (c, parts) in columns.iter().enumerate() {
        out.push(gather_column(
            c,
            samples,
            parts,
            squeezed[c],
            &mut decoder,
            cache,
        )?);
    }
    let info = samples
        .iter()
        .map(|s| {
            (
                s.item.key(),
                s.probability,
                s.table_size,
                s.priority,
                s.times_sampled,
            )
        })
        .collect();
    Ok(Some(Batch { info, columns: out }))
}

/// Loads what gathering `samples` reads (item records, their slices and chunk lists, chunk
/// records, payloads) level by level over the whole batch with prefetches: the loads of one
/// level do not wait on each other, so the memory system serves many at once instead of one
/// cache miss after another.
fn warm(samples: &[HeldSample]) {
    for s in samples {
        reverb_proto::prefetch(Arc::as_ptr(&s.item));
    }
    for level in 0..3 {
        for s in samples {
            s.item.prefetch(level);
        }
    }
}

/// Prefetches the first row each part copies (as [`warm`] does the chunks): rows of large chunks
/// lie far from their headers.
fn warm_rows(columns: &[Vec<Part<'_>>]) {
    for part in columns.iter().flatten() {
        // (Stored bytes follow a few bytes of snappy header: near enough.)
        let at = part.offset.saturating_mul(part.row_bytes().unwrap_or(0));
        reverb_proto::prefetch(part.content.as_ptr().wrapping_add(at));
    }
}

/// Column `c` of `n` samples from its parts (every sample's, in sample order).
fn gather_column(
    c: usize,
    samples: &[HeldSample],
    parts: &[Part<'_>],
    squeeze: bool,
    decoder: &mut snap::raw::Decoder,
    cache: &mut DecodedCache,
) -> Result<Tensor> {
    let n = samples.len();
    let first = parts
        .first()
        .filter(|p| p.sample == 0)
        .ok_or_else(|| ClientError::data_loss(format!("Column {c} has no slices")))?;
    let dtype = first.layout.dtype;
    let row_shape = first.layout.shape().get(1..).unwrap_or(&[]);
    let row = first
        .row_bytes()
        .ok_or_else(|| ClientError::data_loss(format!("Column {c} has too large rows")))?;
    // Every sample's column must have the first one's rows (and so its bytes).
    let rows: usize = parts
        .iter()
        .take_while(|p| p.sample == 0)
        .map(|p| p.length)
        .sum();
    if squeeze && rows != 1 {
        return Err(ClientError::data_loss(format!(
            "Column {c} is squeezed but has {rows} rows"
        )));
    }
    let size = rows
        .checked_mul(row)
        .filter(|&s| s <= isize::MAX as usize)
        .ok_or_else(|| ClientError::data_loss(format!("Column {c} of {rows} rows is too large")))?;
    let total = batch_bytes(n, size)?;
    // Rows are appended in order (the batch's allocation is not zeroed first, but where a
    // tensor is decompressed into its place).
    let mut data = Vec::with_capacity(total);
    let mut sample = 0;
    let mut own = first; // the current sample's first part
    let mut filled = 0; // bytes of the current sample's column written
    let differ = |k: usize| differ(c, parts, k, (dtype, row_shape, rows));
    for part in parts {
        if part.sample != sample {
            if filled != size || part.sample != sample + 1 {
                return Err(differ(if filled != size { sample } else { sample + 1 }));
            }
            (sample, filled, own) = (part.sample, 0, part);
            if part.layout.dtype != dtype
                || part.layout.shape().get(1..) != first.layout.shape().get(1..)
            {
                return Err(differ(sample));
            }
        }
        if part.layout.shape().is_empty()
            || part.layout.dtype != own.layout.dtype
            || part.layout.shape().get(1..) != own.layout.shape().get(1..)
        {
            return Err(ClientError::data_loss(format!(
                "Column {c} mixes chunks of different dtypes or shapes"
            )));
        }
        // (Offsets and lengths of items read from a checkpoint were not checked by a
        // server: nothing here may overflow.)
        let end = part.offset.checked_add(part.length);
        let Some(end) = end.filter(|&end| end <= part.rows()) else {
            return Err(ClientError::data_loss(format!(
                "Column {c} slices rows {}..{} of a chunk with {} rows",
                part.offset as i64,
                end.map_or(-1, |e| e as i64),
                part.rows()
            )));
        };
        let bytes = part.length * row;
        if filled + bytes > size {
            return Err(differ(sample));
        }
        if bytes > 0 {
            let rows = part.offset * row..end * row;
            if let Some(raw) = stored_bytes(part.content, part.len) {
                data.extend_from_slice(&raw[rows]);
            } else if rows.len() == part.len {
                let at = data.len();
                data.resize(at + bytes, 0);
                decompress(decoder, part, &mut data[at..])?;
            } else {
                let whole = cache.get(part, &samples[part.sample], decoder)?;
                data.extend_from_slice(&whole[rows]);
            }
        }
        filled += bytes;
    }
    if filled != size || sample + 1 != n {
        return Err(differ(if filled != size { sample } else { sample + 1 }));
    }
    debug_assert_eq!(data.len(), total);
    let mut shape = Vec::with_capacity(row_shape.len() + 2);
    shape.push(n as i64);
    if !squeeze {
        shape.push(rows as i64);
    }
    shape.extend_from_slice(row_shape);
    Ok(Tensor { dtype, shape, data })
}

/// Compressed chunk tensors decoded whole for some of their rows, kept for later batches of
/// one sampler (up to [`DecodedCache::BUDGET`] bytes by default, the least recently used
/// dropped first): uniform sampling takes single rows of many chunks, and each would
/// otherwise be decoded again for every row a batch takes of it. An entry keeps the item
/// whose chunk it decoded, so the chunk (and the address it is known by) stays the same.
pub struct DecodedCache {
    /// `(payload address, tensor position)` -> its bytes, when it was last used, and the
    /// item holding the chunk.
    tensors: HashMap<(usize, usize), Entry>,
    bytes: usize,
    uses: u64,
    budget: usize,
}

struct Entry {
    bytes: Vec<u8>,
    used: u64,
    _holder: Arc<dyn StoredItem>,
}

impl Default for DecodedCache {
    fn default() -> Self {
        Self::with_budget(Self::BUDGET)
    }
}

impl DecodedCache {
    /// Bytes of decoded tensors kept at most, by default.
    pub const BUDGET: usize = 64 << 20;

    /// A cache keeping at most `budget` bytes (and one tensor being used).
    pub fn with_budget(budget: usize) -> Self {
        Self {
            tensors: HashMap::new(),
            bytes: 0,
            uses: 0,
            budget,
        }
    }

    /// Bytes of the tensors it keeps.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// `part`'s whole tensor decoded (`sample` holds its chunk); room is made for it first.
    fn get(
        &mut self,
        part: &Part<'_>,
        sample: &HeldSample,
        decoder: &mut snap::raw::Decoder,
    ) -> Result<&[u8]> {
        self.uses += 1;
        let key = (part.payload, part.tensor.1);
        if !self.tensors.contains_key(&key) {
            let mut whole = vec![0u8; part.len];
            decompress(decoder, part, &mut whole)?;
            // Room first: what `get` returns is copied at once, so anything may go.
            self.trim(self.budget.saturating_sub(whole.len()));
            self.bytes += whole.len();
            let entry = Entry {
                bytes: whole,
                used: 0,
                _holder: sample.item.clone(),
            };
            self.tensors.insert(key, entry);
        }
        let entry = self.tensors.get_mut(&key).expect("inserted above");
        entry.used = self.uses;
        Ok(&entry.bytes)
    }

    /// Drops the least recently used tensors until at most half of `limit` is kept, once
    /// over `limit`.
    fn trim(&mut self, limit: usize) {
        if self.bytes <= limit {
            return;
        }
        let mut by_use: Vec<(u64, (usize, usize), usize)> = self
            .tensors
            .iter()
            .map(|(key, e)| (e.used, *key, e.bytes.len()))
            .collect();
        by_use.sort_unstable();
        for (_, key, len) in by_use {
            if self.bytes <= limit / 2 {
                break;
            }
            self.tensors.remove(&key);
            self.bytes -= len;
        }
    }
}

/// Decompresses all of `part`'s tensor into `out` (its size).
fn decompress(decoder: &mut snap::raw::Decoder, part: &Part<'_>, out: &mut [u8]) -> Result<()> {
    match decoder.decompress(part.content, out) {
        Ok(written) if written == out.len() => Ok(()),
        Ok(written) => Err(ClientError::data_loss(format!(
            "Chunk {} decompressed to {written} bytes, not {}",
            part.tensor.0,
            out.len()
        ))),
        Err(e) => Err(ClientError::data_loss(format!(
            "Chunk {} cannot be decompressed: {e}",
            part.tensor.0
        ))),
    }
}

/// The error of samples whose column `c` differs from the first sample's (`first`: its
/// dtype, row shape and rows); sample `k` is one.
fn differ(c: usize, parts: &[Part<'_>], k: usize, first: (i32, &[i64], usize)) -> ClientError {
    let (dtype, row_shape, rows) = first;
    let theirs: Vec<&Part<'_>> = parts.iter().filter(|p| p.sample == k).collect();
    let their_rows: usize = theirs.iter().map(|p| p.length).sum();
    let shape = |rows: usize, row: &[i64]| {
        std::iter::once(rows as i64)
            .chain(row.iter().copied())
            .collect::<Vec<_>>()
    };
    let (their_dtype, their_shape) = match theirs.first() {
        Some(p) => (
            p.layout.dtype,
            shape(their_rows, p.layout.shape().get(1..).unwrap_or(&[])),
        ),
        None => (dtype, Vec::new()),
    };
    ClientError::invalid(format!(
        "Sampled items differ in column {c} (dtypes {} and {}, shapes {:?} and {:?}): they \
         cannot be batched",
        dtype_name(dtype),
        dtype_name(their_dtype),
        shape(rows, row_shape),
        their_shape
    ))
}

#[cfg(test)]
mod tests {
    use super::super::{stack, stack_planned, Batch};
    use super::DecodedCache;
    use crate::sample::{plan, Sampled};
    use crate::tensor::{encode_chunk_with, encode_strings, Tensor, DT_STRING};
    use proptest::prelude::*;
    use reverb_core::chunk::{Chunk, ItemData};
    use reverb_proto::flat_trajectory::{ChunkSlice, Column};
    use reverb_proto::held::HeldSample;
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
        HeldSample {
            item: Arc::new(ItemData::new(key, &trajectory, used).unwrap()),
            table: "t".into(),
            priority: key as f64 / 2.0,
            times_sampled: key as i32,
            probability: 1.0 / (key as f64 + 1.0),
            table_size: 10,
        }
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

#[cfg(test)]
mod cache_tests {
    use super::{DecodedCache, Entry};
    use reverb_core::chunk::ItemData;
    use reverb_proto::FlatTrajectory;
    use std::sync::Arc;

    /// Over its limit, the cache keeps the most recently used tensors (down to half of it).
    #[test]
    fn the_least_recently_used_tensors_go_first() {
        let holder = Arc::new(ItemData::new(1, &FlatTrajectory::default(), Vec::new()).unwrap());
        let mut cache = DecodedCache::with_budget(100);
        for key in 0..8usize {
            let entry = Entry {
                bytes: vec![0; 20],
                used: key as u64,
                _holder: holder.clone(),
            };
            cache.tensors.insert((key, 0), entry);
            cache.bytes += 20;
        }
        cache.tensors.get_mut(&(1, 0)).unwrap().used = 99; // used last
        cache.trim(100);
        assert_eq!(cache.bytes(), 40);
        let mut kept: Vec<usize> = cache.tensors.keys().map(|k| k.0).collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![1, 7]);
    }
}
