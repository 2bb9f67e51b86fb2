//! The rows of a table's small one-step items, kept dense in a record per item: a sampled
//! batch of them is then one row copy per column and item, where gathering from chunks walks
//! from each item to its chunks' records and payloads.
//!
//! A table keeps rows while every item it holds has, in each column, one row (one slice of
//! length one) of a fixed-size dtype, the same dtypes and shapes as the others, and at most
//! [`MAX_ROW_BYTES`] in all. The chunks stay what the wire, checkpoints and the other
//! readers use; the rows are a copy of at most [`MAX_ROW_BYTES`] an item.

use crate::chunk::{Chunk, ItemData};
use reverb_proto::gather::Column;
use reverb_proto::held::{SliceView, StoredItem};
use reverb_proto::payload::{dtype_size, scan_tensor_at, stored_bytes, Layout};
use std::sync::{Arc, Weak};

/// Most bytes of rows (all columns) an item may have for its table to keep them.
pub const MAX_ROW_BYTES: usize = 256;

/// Most bytes of a compressed tensor decoded for the rows of its items (a table holding
/// items of larger ones keeps no rows).
const MAX_DECODED: usize = 64 << 10;

/// Records of a block of [`Rows`] (a power of two).
const BLOCK: usize = 1 << 14;

/// The rows of a table's items: one record per item holding its row of each column in turn
/// (a record is a line or two of memory: drawing an item touches that, not a line per
/// column). An item keeps its record while held; the records of removed items
/// are used again, most recently freed first (a FIFO table writes its records in turn).
pub(crate) struct Rows {
    columns: Vec<RowColumn>,
    /// Bytes of a record (the columns' rows).
    stride: usize,
    /// Room for records, [`BLOCK`] records a block (grown a block at a time: never copied,
    /// nor held twice over): the first `used` have held items' rows.
    blocks: Vec<Box<[u8]>>,
    used: usize,
    /// Records of removed items.
    free: Vec<u32>,
}

/// One column of [`Rows`].
struct RowColumn {
    /// TensorFlow `DataType`.
    dtype: i32,
    /// The shape of one row (without the rows dimension).
    row_shape: Vec<i64>,
    /// The column is squeezed (a batch of it has no rows dimension).
    squeeze: bool,
    row_bytes: usize,
    /// Where its row is in a record.
    offset: usize,
    /// The last tensor of several rows read for this column (items of one item run share
    /// their chunks): not read again for the next item.
    last: Option<Tensor>,
}

/// A chunk tensor of several rows, as read for its rows.
struct Tensor {
    /// Its chunk (held weakly: the allocation, so the address, stays its own).
    chunk: Weak<Chunk>,
    index: usize,
    rows: usize,
    bytes: TensorBytes,
}

enum TensorBytes {
    /// Stored uncompressed: its rows start this many bytes into the chunk's payload.
    InPayload(usize),
    /// Compressed: decoded whole.
    Decoded(Vec<u8>),
}

/// Where a column's row of one item is.
struct RowAt {
    slice: SliceView,
    layout: Layout,
    row_bytes: usize,
}

impl Rows {
    /// Rows for items shaped as `item`, holding its rows at slot 0; `None` when such items
    /// are not kept so (see the module's doc).
    pub(crate) fn new(item: &ItemData) -> Option<Rows> {
        let at = row_places(item)?;
        let mut stride = 0;
        let columns = at
            .iter()
            .map(|a| {
                stride += a.row_bytes;
                RowColumn {
                    dtype: a.layout.dtype,
                    row_shape: a.layout.shape()[1..].to_vec(),
                    squeeze: a.slice.squeeze,
                    row_bytes: a.row_bytes,
                    offset: stride - a.row_bytes,
                    last: None,
                }
            })
            .collect();
        let mut rows = Rows {
            columns,
            stride,
            blocks: Vec::new(),
            used: 0,
            free: Vec::new(),
        };
        rows.push(item).map(|_| rows)
    }

    /// Stores `item`'s rows: the record they are in; `None` when it does not fit (other
    /// dtypes or shapes, a row it does not hold readable): then no record is taken (a free
    /// one may have been written in part).
    pub(crate) fn push(&mut self, item: &ItemData) -> Option<u32> {
        let width = self.columns.len();
        let stride = self.stride;
        let at = match self.free.last() {
            Some(&free) => free as usize,
            None => {
                // (u32::MAX is a table's mark of an item without a record.)
                u32::try_from(self.used).ok().filter(|&u| u != u32::MAX)?;
                if self.used == self.blocks.len() * BLOCK {
                    self.blocks
                        .push(vec![0u8; BLOCK * stride].into_boxed_slice());
                }
                self.used
            }
        };
        let within = (at % BLOCK) * stride;
        let record = &mut self.blocks[at / BLOCK][within..within + stride];
        let columns = &mut self.columns;
        let (mut c, mut fits) = (0, item.columns() == width);
        item.for_each_slice(&mut |s| {
            fits = fits
                && c < width
                && s.column == c
                && s.length == 1
                && s.squeeze == columns[c].squeeze
                && columns[c].put_row(record, item, &s);
            c += 1;
        });
        if !fits || c != width {
            return None;
        }
        if self.free.pop().is_none() {
            self.used += 1;
        }
        Some(at as u32)
    }

    /// Frees `record` (of an item removed).
    pub(crate) fn remove(&mut self, record: u32) {
        debug_assert!((record as usize) < self.used);
        self.free.push(record);
    }

    /// The rows in `records`, one column each with a leading batch dimension (shaped as
    /// [`reverb_proto::gather::gather`] shapes a batch of the items).
    pub(crate) fn gather(&self, records: &[u32]) -> Vec<Column> {
        let stride = self.stride;
        let record = |at: u32| {
            let (block, within) = (at as usize / BLOCK, (at as usize % BLOCK) * stride);
            &self.blocks[block][within..within + stride]
        };
        for &at in records {
            let bytes = record(at);
            reverb_proto::prefetch(bytes.as_ptr());
            reverb_proto::prefetch(bytes.as_ptr().wrapping_add(stride.saturating_sub(1)));
        }
        self.columns
            .iter()
            .map(|c| {
                let size = c.row_bytes;
                let mut data = vec![0u8; records.len() * size];
                if size > 0 {
                    for (row, &at) in data.chunks_exact_mut(size).zip(records) {
                        copy_row(row, &record(at)[c.offset..c.offset + size]);
                    }
                }
                let mut shape = Vec::with_capacity(c.row_shape.len() + 2);
                shape.push(records.len() as i64);
                if !c.squeeze {
                    shape.push(1);
                }
                shape.extend_from_slice(&c.row_shape);
                Column {
                    dtype: c.dtype,
                    shape,
                    data,
                }
            })
            .collect()
    }
}

/// Where each column's row of `item` is: `None` unless every column has one row (one slice
/// of one row) of a fixed-size dtype, at most [`MAX_ROW_BYTES`] in all, held in memory.
fn row_places(item: &ItemData) -> Option<Vec<RowAt>> {
    let mut at: Vec<RowAt> = Vec::with_capacity(item.columns());
    let mut fits = true;
    let mut total = 0usize;
    item.for_each_slice(&mut |s| {
        if !fits {
            return;
        }
        let chunk = item.chunk(s.chunk);
        let layout = (s.length == 1 && s.column == at.len() && !chunk.delta_encoded)
            .then(|| scan_tensor_at(chunk.payload, s.index))
            .flatten()
            .map(|(layout, _, _)| layout);
        let row_bytes = layout.as_ref().and_then(|l| {
            let (&rows, row) = l.shape().split_first()?;
            (rows >= 0 && s.offset < rows as usize && row.iter().all(|&d| d >= 0)).then_some(())?;
            row.iter()
                .try_fold(dtype_size(l.dtype)?, |b, &d| b.checked_mul(d as usize))
        });
        match (layout, row_bytes) {
            (Some(layout), Some(row_bytes)) if total + row_bytes <= MAX_ROW_BYTES => {
                total += row_bytes;
                at.push(RowAt {
                    slice: s,
                    layout,
                    row_bytes,
                });
            }
            _ => fits = false,
        }
    });
    (fits && at.len() == item.columns() && !at.is_empty()).then_some(at)
}

impl RowColumn {
    /// Puts the row of `item` that `slice` (one row of this column) names into its place in
    /// `record`; false when it is not of this column's dtype and shape or cannot be
    /// read.
    fn put_row(&mut self, record: &mut [u8], item: &ItemData, slice: &SliceView) -> bool {
        let chunk = &item.chunks()[slice.chunk];
        let size = self.row_bytes;
        let Some(row) = slice
            .offset
            .checked_mul(size)
            .and_then(|from| Some(from..from.checked_add(size)?))
        else {
            return false;
        };
        let payload = chunk.payload();
        if let Some(t) = self
            .last
            .as_ref()
            .filter(|t| Weak::as_ptr(&t.chunk) == Arc::as_ptr(chunk) && t.index == slice.index)
        {
            let bytes = match &t.bytes {
                TensorBytes::InPayload(start) => payload.get(*start..),
                TensorBytes::Decoded(bytes) => Some(&bytes[..]),
            };
            let Some(bytes) = bytes
                .and_then(|b| b.get(row))
                .filter(|_| slice.offset < t.rows)
            else {
                return false;
            };
            copy_row(&mut record[self.offset..self.offset + size], bytes);
            return true;
        }
        self.put_read(record, item, slice, row)
    }

    /// [`RowColumn::put_row`] of a row of a tensor not read for the last item: reads it.
    #[inline(never)]
    fn put_read(
        &mut self,
        record: &mut [u8],
        item: &ItemData,
        slice: &SliceView,
        row: std::ops::Range<usize>,
    ) -> bool {
        let chunk = &item.chunks()[slice.chunk];
        let payload = chunk.payload();
        let size = self.row_bytes;
        if chunk.is_stored() || item.chunk(slice.chunk).delta_encoded {
            return false;
        }
        let Some((layout, content, len)) = scan_tensor_at(payload, slice.index) else {
            return false;
        };
        let Some((&rows, row_shape)) = layout.shape().split_first() else {
            return false;
        };
        if layout.dtype != self.dtype
            || row_shape != &self.row_shape[..]
            || rows < 0
            || slice.offset >= rows as usize
            || Some(len) != (rows as usize).checked_mul(size)
        {
            return false;
        }
        let rows = rows as usize;
        if len == 0 {
            return true; // (Rows of no bytes: nothing to copy.)
        }
        let bytes = match stored_bytes(content, len) {
            Some(raw) => {
                let Some(bytes) = raw.get(row) else {
                    return false;
                };
                copy_row(&mut record[self.offset..self.offset + size], bytes);
                // (Where the rows start in the payload; an empty tensor's may be elsewhere.)
                let start = (raw.as_ptr() as usize).checked_sub(payload.as_ptr() as usize);
                match start.filter(|&s| s.checked_add(len).is_some_and(|e| e <= payload.len())) {
                    Some(start) => TensorBytes::InPayload(start),
                    None => return true,
                }
            }
            // (Decoded under the table's lock: not for large tensors.)
            None if len > MAX_DECODED => return false,
            None => {
                let mut decoded = vec![0u8; len];
                match snap::raw::Decoder::new().decompress(content, &mut decoded) {
                    Ok(n) if n == len => {}
                    _ => return false,
                }
                let Some(bytes) = decoded.get(row) else {
                    return false;
                };
                copy_row(&mut record[self.offset..self.offset + size], bytes);
                TensorBytes::Decoded(decoded)
            }
        };
        if rows > 1 {
            self.last = Some(Tensor {
                chunk: Arc::downgrade(chunk),
                index: slice.index,
                rows,
                bytes,
            });
        }
        true
    }
}

/// Copies a row (`dst` and `src` of one length): rows of up to 128 bytes inline, as two
/// overlapping copies of a fixed size, rather than a call of `memcpy` each.
#[inline]
fn copy_row(dst: &mut [u8], src: &[u8]) {
    /// The first and the last `K` bytes (`K <= len < 2K`).
    #[inline(always)]
    fn ends<const K: usize>(dst: &mut [u8], src: &[u8]) {
        if let (Some(d), Some(s)) = (dst.first_chunk_mut::<K>(), src.first_chunk::<K>()) {
            *d = *s;
        }
        if let (Some(d), Some(s)) = (dst.last_chunk_mut::<K>(), src.last_chunk::<K>()) {
            *d = *s;
        }
    }
    match src.len() {
        0 => {}
        1..=3 => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
        }
        4..=7 => ends::<4>(dst, src),
        8..=15 => ends::<8>(dst, src),
        16..=31 => ends::<16>(dst, src),
        32..=63 => ends::<32>(dst, src),
        64..=128 => ends::<64>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}
