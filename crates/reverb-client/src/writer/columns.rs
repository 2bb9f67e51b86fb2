//! The writer's columns. Each keeps its last `keep_alive` cells referenceable and copies its
//! rows into an open chunk, which is finalized (snappy-encoded, optionally delta-encoded) when
//! it holds its chunk length of rows, when a flush needs it, or at the end of an episode.

use super::episodes::{Envs, Episode};
use super::AppendError;
use crate::tensor::{
    decode_chunk, decode_strings, dtype_size, encode_chunk_with, encode_strings, Tensor, DT_STRING,
};
use crate::{ClientError, Result};
use reverb_proto::{ChunkData, SequenceRange};
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

/// A chunk being built: items and cells share it; its data is set when finalized.
#[derive(Debug)]
pub(super) struct ChunkSlot {
    pub key: u64,
    pub data: OnceLock<Arc<ChunkData>>,
    /// Whether an item carrying the chunk went to the stream (which counts its bytes once).
    pub queued: AtomicBool,
}

impl ChunkSlot {
    /// Whether the chunk is encoded (items referencing it can be sent).
    pub fn finalized(&self) -> bool {
        self.data.get().is_some()
    }
}

/// One written row: the writer-wide step it belongs to and where it sits in its chunk.
#[derive(Debug, Clone)]
pub(super) struct Cell {
    pub step: u64,
    pub slot: Arc<ChunkSlot>,
    pub offset: u32,
}

#[derive(Debug)]
struct OpenChunk {
    slot: Arc<ChunkSlot>,
    first_step: u64,
    last_step: u64,
    rows: usize,
    data: Vec<u8>,
    /// For a string column, where each row's string list ends in `data` (rows vary in size).
    row_ends: Vec<usize>,
}

#[derive(Debug)]
pub(super) struct Column {
    pub dtype: i32,
    pub row_shape: Vec<i64>,
    row_bytes: usize,
    keep_alive: usize,
    max_chunk_length: Option<usize>,
    pub cells: VecDeque<Cell>,
    open: Option<OpenChunk>,
}

/// The rows of an open string chunk, each its own string list.
fn string_rows(open: &OpenChunk) -> impl Iterator<Item = &[u8]> {
    let starts = std::iter::once(0).chain(open.row_ends.iter().copied());
    starts
        .zip(open.row_ends.iter().copied())
        .map(|(start, end)| &open.data[start..end])
}

/// Target size of an automatically sized chunk.
pub(super) const AUTO_CHUNK_BYTES: usize = 16 << 10;

impl Column {
    fn chunk_length(&self) -> usize {
        let wanted = self.max_chunk_length.unwrap_or(self.keep_alive).max(1);
        if self.max_chunk_length.is_some() {
            return wanted;
        }
        // Auto: about AUTO_CHUNK_BYTES per chunk. A sampled item carries whole chunks, so an
        // item of L rows costs about L + chunk_length - 1 rows on the wire: big rows get short
        // chunks (84x84 frames: 2 rows), small rows keep num_keep_alive_refs rows.
        let by_bytes = (AUTO_CHUNK_BYTES / self.row_bytes.max(1)).max(1);
        wanted.min(by_bytes)
    }

    /// Whether `step` has no cell although later and earlier steps are still kept: the step
    /// was appended without this column (the reference's history holds `None` there).
    pub fn skipped(&self, step: u64) -> bool {
        self.cells.front().is_some_and(|first| first.step < step) && self.cell(step).is_none()
    }

    /// The cell of `step`, if still kept.
    pub fn cell(&self, step: u64) -> Option<&Cell> {
        // Cells are in step order and usually one per step: look where that puts `step`
        // first, then search (a column may skip steps).
        let last = self.cells.back()?;
        let back = last.step.checked_sub(step)?;
        if let Some(i) = (self.cells.len() as u64 - 1).checked_sub(back) {
            let cell = &self.cells[i as usize];
            if cell.step == step {
                return Some(cell);
            }
        }
        let i = self.cells.partition_point(|c| c.step < step);
        self.cells.get(i).filter(|c| c.step == step)
    }

    /// The key of the open chunk, if any.
    fn open_key(&self) -> Option<u64> {
        self.open.as_ref().map(|o| o.slot.key)
    }
}

/// A value about to be appended, as [`Columns::check_rows`] checks it.
pub(super) struct Row<'a> {
    /// What errors call it (a writer column, or a field of a vectorised writer).
    pub name: usize,
    /// The column its rows go to (for a field: the column of its first env).
    pub column: usize,
    pub dtype: i32,
    /// The shape of one row.
    pub shape: &'a [i64],
}

/// Checks that `keep_alive` and `max_chunk_length` make sense together.
pub(super) fn check_lengths(keep_alive: usize, max_chunk_length: Option<usize>) -> Result<()> {
    if keep_alive < 1 {
        return Err(ClientError::invalid(format!(
            "num_keep_alive_refs ({keep_alive}) must be >= 1"
        )));
    }
    if let Some(n) = max_chunk_length {
        if n < 1 || n > keep_alive {
            return Err(ClientError::invalid(format!(
                "max_chunk_length ({n}) must be in [1, num_keep_alive_refs ({keep_alive})]"
            )));
        }
    }
    Ok(())
}

/// Every column of a writer, by index (created on their first row).
#[derive(Debug)]
pub(super) struct Columns {
    columns: Vec<Option<Column>>,
    /// Per-column overrides from `configure`, applied when the column first appears.
    overrides: Vec<(usize, usize, Option<usize>)>,
    keep_alive: usize,
    max_chunk_length: Option<usize>,
    delta_encode: bool,
}

impl Columns {
    pub fn new(keep_alive: usize, max_chunk_length: Option<usize>, delta_encode: bool) -> Self {
        Self {
            columns: Vec::new(),
            overrides: Vec::new(),
            keep_alive,
            max_chunk_length,
            delta_encode,
        }
    }

    /// Number of column indices in use (some may have no rows yet).
    pub fn len(&self) -> usize {
        self.columns.len()
    }

    /// The column, once it has a row.
    pub fn get(&self, column: usize) -> Option<&Column> {
        self.columns.get(column)?.as_ref()
    }

    /// Every column with rows.
    pub fn iter(&self) -> impl Iterator<Item = &Column> {
        self.columns.iter().flatten()
    }

    /// `(dtype, row shape)` of a column, once it has a row.
    pub fn spec(&self, column: usize) -> Option<(i32, Vec<i64>)> {
        self.get(column).map(|c| (c.dtype, c.row_shape.clone()))
    }

    /// Checks rows about to be appended, before anything changes: each name once per call,
    /// the dtype and row shape a column already has, a supported dtype, and (in an open
    /// partial step `open_step`) no second value for a column.
    pub fn check_rows<'a>(
        &self,
        rows: impl IntoIterator<Item = Row<'a>>,
        open_step: Option<u64>,
    ) -> std::result::Result<(), AppendError> {
        let mut seen: Vec<usize> = Vec::new();
        for row in rows {
            if seen.contains(&row.name) {
                return Err(AppendError::AlreadySet(row.name));
            }
            seen.push(row.name);
            if let Some(col) = self.get(row.column) {
                if open_step.is_some_and(|s| col.cells.back().is_some_and(|c| c.step == s)) {
                    return Err(AppendError::AlreadySet(row.name));
                }
                if col.dtype != row.dtype || col.row_shape != row.shape {
                    return Err(AppendError::Mismatch {
                        column: row.name,
                        expected: (col.dtype, col.row_shape.clone()),
                        got: (row.dtype, row.shape.to_vec()),
                    });
                }
            }
            if dtype_size(row.dtype).is_none() && row.dtype != DT_STRING {
                return Err(AppendError::Other(ClientError::invalid(format!(
                    "Unsupported dtype {}",
                    row.dtype
                ))));
            }
        }
        Ok(())
    }

    /// Overrides keep-alive and chunk length (checked by `check_lengths`) of one column, before
    /// or after it first appears; an existing open chunk is finalized first, in `env`'s
    /// episode.
    pub fn configure(
        &mut self,
        column: usize,
        keep_alive: usize,
        max_chunk_length: Option<usize>,
        env: Episode,
    ) {
        if self.get(column).is_some() {
            self.finalize(column, env);
            let col = self.columns[column].as_mut().expect("checked");
            col.keep_alive = keep_alive;
            col.max_chunk_length = max_chunk_length;
            while col.cells.len() > keep_alive {
                col.cells.pop_front();
            }
        }
        self.overrides.retain(|o| o.0 != column);
        self.overrides.push((column, keep_alive, max_chunk_length));
    }

    /// Appends a row (checked by `check_rows`) to a column at `step`; a full chunk is
    /// finalized in the current episode of the column's env (looked up only then: this is
    /// the per-row hot path).
    pub fn push_row(
        &mut self,
        column: usize,
        step: u64,
        dtype: i32,
        shape: &[i64],
        data: &[u8],
        envs: &Envs,
    ) {
        if self.columns.len() <= column {
            self.columns.resize_with(column + 1, || None);
        }
        let (defaults, overrides) = ((self.keep_alive, self.max_chunk_length), &self.overrides);
        let col = self.columns[column].get_or_insert_with(|| {
            // (Looked up once, when the column first appears.)
            let (keep_alive, max_chunk_length) = overrides
                .iter()
                .find(|o| o.0 == column)
                .map_or(defaults, |o| (o.1, o.2));
            Column {
                dtype,
                row_shape: shape.to_vec(),
                row_bytes: data.len(),
                keep_alive,
                max_chunk_length,
                cells: VecDeque::new(),
                open: None,
            }
        });
        // Room for the whole chunk up front: no reallocation (and page faults) while it fills.
        let capacity = col.chunk_length() * col.row_bytes;
        let open = col.open.get_or_insert_with(|| OpenChunk {
            slot: Arc::new(ChunkSlot {
                key: rand::random(),
                data: OnceLock::new(),
                queued: AtomicBool::new(false),
            }),
            first_step: step,
            last_step: step,
            rows: 0,
            data: Vec::with_capacity(capacity),
            row_ends: Vec::new(),
        });
        open.data.extend_from_slice(data);
        if col.dtype == DT_STRING {
            open.row_ends.push(open.data.len());
        }
        open.last_step = step;
        open.rows += 1;
        col.cells.push_back(Cell {
            step,
            slot: open.slot.clone(),
            offset: (open.rows - 1) as u32,
        });
        if col.cells.len() > col.keep_alive {
            col.cells.pop_front();
        }
        // String rows vary in size: an automatically sized string chunk also ends once it
        // holds about AUTO_CHUNK_BYTES.
        let (rows, bytes) = (open.rows, open.data.len());
        let full = rows >= col.chunk_length()
            || (col.dtype == DT_STRING
                && col.max_chunk_length.is_none()
                && bytes >= AUTO_CHUNK_BYTES);
        if full {
            self.finalize(column, envs.of_column(column));
        }
    }

    /// Encodes a column's open chunk, as rows of `env`'s episode.
    pub fn finalize(&mut self, column: usize, env: Episode) {
        let delta = self.delta_encode;
        let Some(col) = self.columns.get_mut(column).and_then(Option::as_mut) else {
            return;
        };
        let Some(open) = col.open.take() else { return };
        let mut shape = Vec::with_capacity(col.row_shape.len() + 1);
        shape.push(open.rows as i64);
        shape.extend_from_slice(&col.row_shape);
        let data = if col.dtype == DT_STRING {
            // Each row is a string list of its own: one list of every row's elements.
            let per_row: usize = col.row_shape.iter().map(|&d| d as usize).product();
            let elements: Vec<&[u8]> = string_rows(&open)
                .flat_map(|row| decode_strings(row, per_row).expect("checked when appended"))
                .collect();
            encode_strings(elements.iter().copied())
        } else {
            open.data
        };
        let tensor = Tensor {
            dtype: col.dtype,
            shape,
            data,
        };
        let range = SequenceRange {
            episode_id: env.episode_id,
            start: (open.first_step - env.start) as i32,
            end: (open.last_step - env.start) as i32,
            sparse: (open.last_step - open.first_step + 1) as usize != open.rows,
        };
        let chunk = encode_chunk_with(open.slot.key, range, std::slice::from_ref(&tensor), delta);
        let _ = open.slot.data.set(Arc::new(chunk));
    }

    /// Columns whose open chunk is one of `keys`.
    pub fn open_in(&self, keys: &[u64]) -> Vec<usize> {
        (0..self.columns.len())
            .filter(|&c| {
                self.get(c)
                    .and_then(Column::open_key)
                    .is_some_and(|k| keys.contains(&k))
            })
            .collect()
    }

    /// Whether a column's chunk length is chosen automatically (no `max_chunk_length`).
    pub fn auto_length(&self, column: usize) -> bool {
        self.get(column)
            .is_some_and(|c| c.max_chunk_length.is_none())
    }

    /// Drops a column's history (every cell expires).
    pub fn clear_cells(&mut self, column: usize) {
        if let Some(Some(col)) = self.columns.get_mut(column) {
            col.cells.clear();
        }
    }

    /// The row of a cell as a tensor; `None` when expired.
    pub fn read_cell(&self, column: usize, step: u64) -> Result<Option<Tensor>> {
        let Some(col) = self.get(column) else {
            return Ok(None);
        };
        let Some(cell) = col.cell(step) else {
            return Ok(None);
        };
        let row = col.row_bytes;
        let offset = cell.offset as usize;
        if col.dtype == DT_STRING {
            let per_row: usize = col.row_shape.iter().map(|&d| d as usize).product();
            let data = match cell.slot.data.get() {
                Some(chunk) => {
                    let decoded = decode_chunk(chunk)?;
                    let all = decoded[0].strings()?;
                    encode_strings(
                        all[offset * per_row..(offset + 1) * per_row]
                            .iter()
                            .copied(),
                    )
                }
                None => {
                    let open = col
                        .open
                        .as_ref()
                        .expect("an unfinalized cell is in the open chunk");
                    string_rows(open)
                        .nth(offset)
                        .expect("the cell's row")
                        .to_vec()
                }
            };
            return Ok(Some(Tensor {
                dtype: col.dtype,
                shape: col.row_shape.clone(),
                data,
            }));
        }
        let data = match cell.slot.data.get() {
            Some(chunk) => {
                let decoded = decode_chunk(chunk)?;
                decoded[0].data[offset * row..(offset + 1) * row].to_vec()
            }
            None => {
                let open = col
                    .open
                    .as_ref()
                    .expect("an unfinalized cell is in the open chunk");
                open.data[offset * row..(offset + 1) * row].to_vec()
            }
        };
        Ok(Some(Tensor {
            dtype: col.dtype,
            shape: col.row_shape.clone(),
            data,
        }))
    }

    /// Which of `steps` of `column` are still referenceable.
    pub fn alive(&self, column: usize, steps: &[u64]) -> Vec<bool> {
        match self.get(column) {
            Some(col) => steps.iter().map(|&s| col.cell(s).is_some()).collect(),
            None => vec![false; steps.len()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `cell` finds exactly the kept cells, whatever steps a column skipped.
        #[test]
        fn cell_finds_each_kept_step(
            gaps in proptest::collection::vec(1u64..4, 1..40),
            keep_alive in 1usize..12,
        ) {
            let envs = Envs::new(1);
            let mut columns = Columns::new(keep_alive, Some(3), false);
            let mut step = 0;
            for gap in gaps {
                step += gap;
                columns.push_row(0, step, 1, &[], &[0; 4], &envs);
            }
            let column = columns.get(0).unwrap();
            for probe in 0..step + 3 {
                let expected = column.cells.iter().find(|c| c.step == probe);
                prop_assert_eq!(column.cell(probe).map(|c| c.step), expected.map(|c| c.step));
            }
        }
    }
}
