//! A batch of held samples (items as a server stores them), gathered column by column
//! straight from their chunks: each slice's rows are copied from the tensor's stored bytes
//! (or decompressed into their place; a compressed tensor taken in part is decoded whole
//! once and kept for later batches in a [`DecodedCache`]), with no message, no per-sample
//! allocation and no decoded copy of chunks stored uncompressed. A client of a server in its
//! process gathers its batches so; a server gathers the batches it sends as columns
//! (`SampleStreamRequest.columnar`).

use crate::held::{HeldSample, StoredItem};
use crate::payload::{dtype_name, dtype_size, stored_bytes, Layout, TensorScan};
use std::collections::HashMap;
use std::sync::Arc;

/// Why samples cannot be gathered into a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatherError {
    /// They differ (columns, dtypes, shapes): they cannot be batched.
    Invalid(String),
    /// What is stored is malformed.
    DataLoss(String),
}

impl std::fmt::Display for GatherError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatherError::Invalid(m) | GatherError::DataLoss(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for GatherError {}

type Result<T> = std::result::Result<T, GatherError>;

fn invalid(message: String) -> GatherError {
    GatherError::Invalid(message)
}

fn data_loss(message: String) -> GatherError {
    GatherError::DataLoss(message)
}

/// A gathered batch: info and one column per data column, each with a leading batch
/// dimension.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// `(key, probability, table_size, priority, times_sampled)` per sample.
    pub info: Vec<(u64, f64, i64, f64, i32)>,
    /// One column per data column.
    pub columns: Vec<Column>,
}

/// A dense column of a batch: dtype, shape (batch dimension first) and its bytes in
/// row-major order, little-endian (as stored).
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// TensorFlow `DataType` value.
    pub dtype: i32,
    /// Dimensions.
    pub shape: Vec<i64>,
    /// Row-major element bytes.
    pub data: Vec<u8>,
}

impl From<Batch> for crate::SampleBatch {
    /// The batch as a sample stream sends it (`SampleStreamResponse.batch`), every column
    /// inline.
    fn from(b: Batch) -> Self {
        let info = &b.info;
        crate::SampleBatch {
            keys: info.iter().map(|i| i.0).collect(),
            probabilities: info.iter().map(|i| i.1).collect(),
            table_sizes: info.iter().map(|i| i.2).collect(),
            priorities: info.iter().map(|i| i.3).collect(),
            times_sampled: info.iter().map(|i| i.4).collect(),
            columns: b
                .columns
                .into_iter()
                .map(|c| crate::sample_batch::Column {
                    dtype: c.dtype,
                    shape: c.shape,
                    data: c.data.into(),
                    ..Default::default()
                })
                .collect(),
        }
    }
}

/// Bytes of a batch of `n` samples of `size` bytes (an error when that cannot be held).
pub fn batch_bytes(n: usize, size: usize) -> Result<usize> {
    size.checked_mul(n)
        .filter(|&t| t <= isize::MAX as usize)
        .ok_or_else(|| invalid(format!("A batch of {n} x {size} bytes is too large")))
}

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
pub fn gather(samples: &[HeldSample], cache: &mut DecodedCache) -> Result<Option<Batch>> {
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
            return Err(invalid(format!(
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
        return Err(invalid(format!(
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
        crate::prefetch(Arc::as_ptr(&s.item));
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
        crate::prefetch(part.content.as_ptr().wrapping_add(at));
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
) -> Result<Column> {
    let n = samples.len();
    let first = parts
        .first()
        .filter(|p| p.sample == 0)
        .ok_or_else(|| data_loss(format!("Column {c} has no slices")))?;
    let dtype = first.layout.dtype;
    let row_shape = first.layout.shape().get(1..).unwrap_or(&[]);
    let row = first
        .row_bytes()
        .ok_or_else(|| data_loss(format!("Column {c} has too large rows")))?;
    // Every sample's column must have the first one's rows (and so its bytes).
    let rows: usize = parts
        .iter()
        .take_while(|p| p.sample == 0)
        .map(|p| p.length)
        .sum();
    if squeeze && rows != 1 {
        return Err(data_loss(format!(
            "Column {c} is squeezed but has {rows} rows"
        )));
    }
    let size = rows
        .checked_mul(row)
        .filter(|&s| s <= isize::MAX as usize)
        .ok_or_else(|| data_loss(format!("Column {c} of {rows} rows is too large")))?;
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
            return Err(data_loss(format!(
                "Column {c} mixes chunks of different dtypes or shapes"
            )));
        }
        // (Offsets and lengths of items read from a checkpoint were not checked by a
        // server: nothing here may overflow.)
        let end = part.offset.checked_add(part.length);
        let Some(end) = end.filter(|&end| end <= part.rows()) else {
            return Err(data_loss(format!(
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
    Ok(Column { dtype, shape, data })
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
        Ok(written) => Err(data_loss(format!(
            "Chunk {} decompressed to {written} bytes, not {}",
            part.tensor.0,
            out.len()
        ))),
        Err(e) => Err(data_loss(format!(
            "Chunk {} cannot be decompressed: {e}",
            part.tensor.0
        ))),
    }
}

/// The error of samples whose column `c` differs from the first sample's (`first`: its
/// dtype, row shape and rows); sample `k` is one.
fn differ(c: usize, parts: &[Part<'_>], k: usize, first: (i32, &[i64], usize)) -> GatherError {
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
    invalid(format!(
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
    use super::{DecodedCache, Entry};
    use crate::held::{ChunkView, SliceView, StoredItem};
    use crate::{ChunkData, PrioritizedItem};
    use std::sync::Arc;

    /// An item without chunks (what holds a cache entry's chunk alive does not matter here).
    #[derive(Debug)]
    struct Nothing;

    impl StoredItem for Nothing {
        fn key(&self) -> u64 {
            1
        }
        fn columns(&self) -> usize {
            0
        }
        fn chunk_count(&self) -> usize {
            0
        }
        fn chunk(&self, _: usize) -> ChunkView<'_> {
            unreachable!("no chunks")
        }
        fn prefetch(&self, _: usize) {}
        fn for_each_slice(&self, _: &mut dyn FnMut(SliceView)) {}
        fn to_wire(&self, _: &str, _: f64, _: i32) -> (PrioritizedItem, Vec<ChunkData>) {
            (PrioritizedItem::default(), Vec::new())
        }
    }

    /// Over its limit, the cache keeps the most recently used tensors (down to half of it).
    #[test]
    fn the_least_recently_used_tensors_go_first() {
        let holder: Arc<dyn StoredItem> = Arc::new(Nothing);
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
