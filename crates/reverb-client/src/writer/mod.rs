//! The trajectory writer: per-column chunking of appended steps, items built from column
//! history, and a background insert stream with confirmations (see `stream.rs`).
//!
//! Every column keeps its last `num_keep_alive_refs` cells alive. Rows go into the column's
//! open chunk, which is finalized (snappy-encoded) when it holds `max_chunk_length` rows, when
//! a flush needs it, or at the end of an episode. An item is sent once every chunk it
//! references is finalized; items leave in creation order.

mod stream;

use crate::tensor::{decode_chunk, dtype_size, encode_chunk_with, Tensor};
use crate::{runtime, Client, ClientError, Result};
use reverb_proto::flat_trajectory::{ChunkSlice, Column as FlatColumn};
use reverb_proto::{ChunkData, FlatTrajectory, PrioritizedItem, SequenceRange};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use stream::{Outgoing, Shared};
use tokio::sync::mpsc;
use tonic::Code;

/// Settings of a writer.
#[derive(Debug, Clone)]
pub struct WriterOptions {
    /// Cells each column keeps referenceable (the reference's `num_keep_alive_refs`).
    pub num_keep_alive_refs: usize,
    /// Rows per chunk; `None` picks `num_keep_alive_refs`, shortened for big rows (about 16 KiB
    /// per chunk).
    pub max_chunk_length: Option<usize>,
    /// Items sent but not yet confirmed before `create_item` waits (back-pressure).
    pub max_in_flight_items: usize,
    /// How long to keep reconnecting after the server becomes unavailable.
    pub reconnect_timeout: Duration,
    /// Delta-encode integer columns along time before compressing.
    pub delta_encode: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        Self {
            num_keep_alive_refs: 1,
            max_chunk_length: None,
            max_in_flight_items: 1024,
            reconnect_timeout: Duration::from_secs(60),
            delta_encode: false,
        }
    }
}

/// One episode being written.
#[derive(Debug, Clone, Copy)]
struct Lane {
    episode_id: u64,
    /// `step` at the start of the episode.
    start: u64,
}

impl Lane {
    fn new(start: u64) -> Self {
        Self {
            episode_id: rand::random(),
            start,
        }
    }
}

/// Which episode steps of each lane an item column takes (Python's indexing, relative to
/// the lane's episode so far).
#[derive(Debug, Clone)]
pub enum Steps {
    /// One step (negative counts from the end); the column is squeezed.
    Index(i64),
    /// `start:stop:step`, as Python slices them.
    Slice(Option<i64>, Option<i64>, Option<i64>),
    /// These steps, in order.
    List(Vec<i64>),
}

impl Steps {
    /// Episode steps of a lane with `len` steps, or an error naming what is out of range.
    fn resolve(&self, len: i64) -> std::result::Result<Vec<i64>, String> {
        let one = |i: i64| {
            let j = if i < 0 { i + len } else { i };
            if (0..len).contains(&j) {
                Ok(j)
            } else {
                Err(format!("history index {i} out of range for {len} steps"))
            }
        };
        match self {
            Steps::Index(i) => Ok(vec![one(*i)?]),
            Steps::List(v) => v.iter().map(|&i| one(i)).collect(),
            Steps::Slice(start, stop, step) => {
                let step = step.unwrap_or(1);
                if step == 0 {
                    return Err("slice step cannot be zero".into());
                }
                let clamp = |v: Option<i64>, default: i64, lo: i64, hi: i64| match v {
                    None => default,
                    Some(v) if v < 0 => (v + len).max(lo),
                    Some(v) => v.min(hi),
                };
                let mut out = Vec::new();
                if step > 0 {
                    let (a, b) = (clamp(*start, 0, 0, len), clamp(*stop, len, 0, len));
                    let mut i = a;
                    while i < b {
                        out.push(i);
                        i = match i.checked_add(step) {
                            Some(next) => next,
                            None => break,
                        };
                    }
                } else {
                    let a = clamp(*start, len - 1, -1, len - 1);
                    let b = clamp(*stop, -1, -1, len - 1);
                    let mut i = a;
                    while i > b {
                        out.push(i);
                        i = match i.checked_add(step) {
                            Some(next) => next,
                            None => break,
                        };
                    }
                }
                Ok(out)
            }
        }
    }
}

/// A chunk being built: items and cells share it; its data is set when finalized.
#[derive(Debug)]
struct ChunkSlot {
    key: u64,
    data: OnceLock<Arc<ChunkData>>,
}

#[derive(Debug, Clone)]
struct Cell {
    step: u64,
    slot: Arc<ChunkSlot>,
    offset: u32,
}

#[derive(Debug)]
struct OpenChunk {
    slot: Arc<ChunkSlot>,
    first_step: u64,
    last_step: u64,
    rows: usize,
    data: Vec<u8>,
}

#[derive(Debug)]
struct Column {
    dtype: i32,
    row_shape: Vec<i64>,
    row_bytes: usize,
    keep_alive: usize,
    max_chunk_length: Option<usize>,
    cells: VecDeque<Cell>,
    open: Option<OpenChunk>,
}

/// Target size of an automatically sized chunk.
const AUTO_CHUNK_BYTES: usize = 16 << 10;

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

    fn cell(&self, step: u64) -> Option<&Cell> {
        let i = self.cells.partition_point(|c| c.step < step);
        self.cells.get(i).filter(|c| c.step == step)
    }
}

/// One column of an item: the cells `(column, step)` it concatenates, squeezed or not.
#[derive(Debug, Clone)]
pub struct ItemColumn {
    /// `(writer column, episode step)` of each row, in order.
    pub refs: Vec<(usize, u64)>,
    /// Drop the leading dimension (exactly one ref).
    pub squeeze: bool,
}

/// What went wrong in an append, with the column it concerns (so callers can name its path).
#[derive(Debug, Clone, PartialEq)]
pub enum AppendError {
    /// The column already has a value in the open step.
    AlreadySet(usize),
    /// The value's dtype or shape differs from the column's first value.
    Mismatch {
        /// Column index.
        column: usize,
        /// `(dtype, row shape)` the column holds.
        expected: (i32, Vec<i64>),
        /// `(dtype, row shape)` that was passed.
        got: (i32, Vec<i64>),
    },
    /// Anything else.
    Other(ClientError),
}

/// Writes trajectories to one server. Not `Sync`: wrap it in a mutex to share it.
pub struct TrajectoryWriter {
    client: Client,
    options: WriterOptions,
    columns: Vec<Option<Column>>,
    /// Per-column overrides from `configure`, applied when the column first appears.
    overrides: Vec<(usize, usize, Option<usize>)>,
    /// The episodes being written: one for a plain writer, one per environment for a
    /// vectorised one. Column `c` belongs to lane `c % lanes.len()`.
    lanes: Vec<Lane>,
    /// Index of the open step since the writer was created (cells are keyed by it).
    step: u64,
    step_open: bool,
    pending: VecDeque<(PrioritizedItem, Vec<Arc<ChunkSlot>>)>,
    /// Chunks referenced by `pending` items, with their reference counts.
    pending_chunks: HashMap<u64, (Arc<ChunkSlot>, usize)>,
    tx: Option<mpsc::UnboundedSender<Outgoing>>,
    task: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
    sent: u64,
}

impl TrajectoryWriter {
    /// A writer sending to `client`'s server.
    pub fn new(client: Client, options: WriterOptions) -> Result<Self> {
        if options.num_keep_alive_refs < 1 {
            return Err(ClientError::invalid(format!(
                "num_keep_alive_refs ({}) must be >= 1",
                options.num_keep_alive_refs
            )));
        }
        if let Some(n) = options.max_chunk_length {
            if n < 1 || n > options.num_keep_alive_refs {
                return Err(ClientError::invalid(format!(
                    "max_chunk_length ({n}) must be in [1, num_keep_alive_refs ({})]",
                    options.num_keep_alive_refs
                )));
            }
        }
        let shared = Arc::new(Shared::default());
        // Unbounded, but `pump` keeps at most `max_in_flight_items` unconfirmed.
        let (tx, rx) = mpsc::unbounded_channel();
        let task = runtime().spawn(stream::run(
            client.clone(),
            rx,
            shared.clone(),
            options.max_in_flight_items.max(1),
            options.reconnect_timeout,
        ));
        Ok(Self {
            client,
            options,
            columns: Vec::new(),
            overrides: Vec::new(),
            lanes: vec![Lane::new(0)],
            step: 0,
            step_open: false,
            pending: VecDeque::new(),
            pending_chunks: HashMap::new(),
            tx: Some(tx),
            task,
            shared,
            sent: 0,
        })
    }

    /// Full steps appended since the episode began.
    pub fn episode_steps(&self) -> u64 {
        self.step - self.lanes[0].start
    }

    /// The writer-wide step index where the current episode began. Cells are addressed by
    /// writer-wide step: episode step `i` is `episode_start() + i`.
    pub fn episode_start(&self) -> u64 {
        self.lanes[0].start
    }

    /// Whether a partial step is open.
    pub fn step_is_open(&self) -> bool {
        self.step_open
    }

    /// `(dtype, row shape)` of a column, once it has a value.
    pub fn column_spec(&self, column: usize) -> Option<(i32, Vec<i64>)> {
        self.columns
            .get(column)?
            .as_ref()
            .map(|c| (c.dtype, c.row_shape.clone()))
    }

    /// Overrides keep-alive and chunk length of one column (before or after it first appears;
    /// an existing open chunk is finalized first).
    pub fn configure(
        &mut self,
        column: usize,
        num_keep_alive_refs: usize,
        max_chunk_length: Option<usize>,
    ) -> Result<()> {
        if num_keep_alive_refs < 1 {
            return Err(ClientError::invalid(format!(
                "num_keep_alive_refs ({num_keep_alive_refs}) must be >= 1"
            )));
        }
        if let Some(n) = max_chunk_length {
            if n < 1 || n > num_keep_alive_refs {
                return Err(ClientError::invalid(format!(
                    "max_chunk_length ({n}) must be in [1, num_keep_alive_refs ({num_keep_alive_refs})]"
                )));
            }
        }
        self.check_error()?;
        if let Some(Some(_)) = self.columns.get(column) {
            self.finalize(column);
            let col = self.columns[column].as_mut().expect("checked");
            col.keep_alive = num_keep_alive_refs;
            col.max_chunk_length = max_chunk_length;
            while col.cells.len() > num_keep_alive_refs {
                col.cells.pop_front();
            }
        }
        self.overrides.retain(|o| o.0 != column);
        self.overrides
            .push((column, num_keep_alive_refs, max_chunk_length));
        Ok(())
    }

    fn check_error(&self) -> Result<()> {
        match &self.shared.progress.lock().unwrap().error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Appends values `(column, row)` to the open step; closes the step unless `partial`.
    /// Checks everything first: a failed append changes nothing.
    pub fn append(
        &mut self,
        values: Vec<(usize, Tensor)>,
        partial: bool,
    ) -> std::result::Result<(), AppendError> {
        self.check_error().map_err(AppendError::Other)?;
        for (i, (column, value)) in values.iter().enumerate() {
            if values[..i].iter().any(|(c, _)| c == column) {
                return Err(AppendError::AlreadySet(*column));
            }
            if let Some(Some(col)) = self.columns.get(*column) {
                if self.step_open && col.cells.back().is_some_and(|c| c.step == self.step) {
                    return Err(AppendError::AlreadySet(*column));
                }
                if col.dtype != value.dtype || col.row_shape != value.shape {
                    return Err(AppendError::Mismatch {
                        column: *column,
                        expected: (col.dtype, col.row_shape.clone()),
                        got: (value.dtype, value.shape.clone()),
                    });
                }
            }
            if dtype_size(value.dtype).is_none() {
                return Err(AppendError::Other(ClientError::invalid(format!(
                    "Unsupported dtype {}",
                    value.dtype
                ))));
            }
        }
        let step = self.step;
        for (column, value) in values {
            self.push_row(column, step, value.dtype, &value.shape, &value.data);
        }
        if partial {
            self.step_open = true;
        } else {
            self.step_open = false;
            self.step += 1;
        }
        Ok(())
    }

    /// Appends `n` full steps at once: each value has a leading dimension of `n`.
    pub fn append_steps(
        &mut self,
        values: Vec<(usize, Tensor)>,
    ) -> std::result::Result<u64, AppendError> {
        if self.step_open {
            return Err(AppendError::Other(ClientError::invalid(
                "append_steps needs a closed step; finish the partial step first",
            )));
        }
        let n = match values.first() {
            None => return Ok(0),
            Some((_, v)) => v.shape.first().copied().unwrap_or(-1),
        };
        if n < 0
            || values
                .iter()
                .any(|(_, v)| v.shape.first().copied() != Some(n))
        {
            return Err(AppendError::Other(ClientError::invalid(
                "append_steps needs every value to have the same leading (step) dimension",
            )));
        }
        // Check against existing columns before changing anything.
        let rows: Vec<(usize, Tensor)> = values
            .iter()
            .map(|(c, v)| {
                (
                    *c,
                    Tensor {
                        dtype: v.dtype,
                        shape: v.shape[1..].to_vec(),
                        data: Vec::new(),
                    },
                )
            })
            .collect();
        for (i, (column, row)) in rows.iter().enumerate() {
            if rows[..i].iter().any(|(c, _)| c == column) {
                return Err(AppendError::AlreadySet(*column));
            }
            if let Some(Some(col)) = self.columns.get(*column) {
                if col.dtype != row.dtype || col.row_shape != row.shape {
                    return Err(AppendError::Mismatch {
                        column: *column,
                        expected: (col.dtype, col.row_shape.clone()),
                        got: (row.dtype, row.shape.clone()),
                    });
                }
            }
        }
        for t in 0..n as usize {
            let step = self.step;
            for (column, value) in &values {
                let row_bytes = value.row_bytes();
                let row = &value.data[t * row_bytes..(t + 1) * row_bytes];
                self.push_row(*column, step, value.dtype, &value.shape[1..], row);
            }
            self.step += 1;
        }
        Ok(n as u64)
    }

    fn push_row(&mut self, column: usize, step: u64, dtype: i32, shape: &[i64], data: &[u8]) {
        if self.columns.len() <= column {
            self.columns.resize_with(column + 1, || None);
        }
        let keep_alive = self.options.num_keep_alive_refs;
        let max_chunk_length = self.options.max_chunk_length;
        let overrides = &self.overrides;
        let col = self.columns[column].get_or_insert_with(|| {
            let (keep_alive, max_chunk_length) = overrides
                .iter()
                .find(|o| o.0 == column)
                .map_or((keep_alive, max_chunk_length), |o| (o.1, o.2));
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
            }),
            first_step: step,
            last_step: step,
            rows: 0,
            data: Vec::with_capacity(capacity),
        });
        open.data.extend_from_slice(data);
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
        if open.rows >= col.chunk_length() {
            self.finalize(column);
        }
    }

    /// Encodes a column's open chunk.
    fn finalize(&mut self, column: usize) {
        let delta = self.options.delta_encode;
        let Lane {
            episode_id,
            start: episode_start,
        } = self.lanes[column % self.lanes.len()];
        let Some(col) = self.columns.get_mut(column).and_then(Option::as_mut) else {
            return;
        };
        let Some(open) = col.open.take() else { return };
        let mut shape = Vec::with_capacity(col.row_shape.len() + 1);
        shape.push(open.rows as i64);
        shape.extend_from_slice(&col.row_shape);
        let tensor = Tensor {
            dtype: col.dtype,
            shape,
            data: open.data,
        };
        let range = SequenceRange {
            episode_id,
            start: (open.first_step - episode_start) as i32,
            end: (open.last_step - episode_start) as i32,
            sparse: (open.last_step - open.first_step + 1) as usize != open.rows,
        };
        let chunk = encode_chunk_with(open.slot.key, range, std::slice::from_ref(&tensor), delta);
        let _ = open.slot.data.set(Arc::new(chunk));
    }

    /// The row of a cell as a tensor (for `TrajectoryColumn.numpy()`); `None` when expired.
    pub fn read_cell(&self, column: usize, step: u64) -> Result<Option<Tensor>> {
        let Some(Some(col)) = self.columns.get(column) else {
            return Ok(None);
        };
        let Some(cell) = col.cell(step) else {
            return Ok(None);
        };
        let row = col.row_bytes;
        let offset = cell.offset as usize;
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
        match self.columns.get(column) {
            Some(Some(col)) => steps.iter().map(|&s| col.cell(s).is_some()).collect(),
            _ => vec![false; steps.len()],
        }
    }

    /// Creates an item in `table`. It is sent once the chunks it references are finalized.
    /// Returns its key. May wait (up to `deadline`) when too many items are unconfirmed;
    /// returns `Ok((key, false))` if it had to stop waiting (the item is queued regardless).
    pub fn create_item(
        &mut self,
        table: &str,
        priority: f64,
        columns: &[ItemColumn],
        deadline: Option<Instant>,
    ) -> Result<(u64, bool)> {
        self.check_error()?;
        let key = self.queue_item(table, priority, columns)?;
        let done = self.pump(deadline)?;
        Ok((key, done))
    }

    /// Checks an item and queues it (it leaves with the next `pump`); returns its key.
    fn queue_item(&mut self, table: &str, priority: f64, columns: &[ItemColumn]) -> Result<u64> {
        if table.is_empty() {
            return Err(ClientError::invalid("table must be a non-empty string"));
        }
        if columns.is_empty() {
            return Err(ClientError::invalid(
                "An item must have at least one column",
            ));
        }
        let mut flat = Vec::with_capacity(columns.len());
        let mut slots: Vec<Arc<ChunkSlot>> = Vec::new();
        for (i, column) in columns.iter().enumerate() {
            if column.refs.is_empty() {
                return Err(ClientError::invalid(format!(
                    "Column {i} of the item has no data references"
                )));
            }
            if column.squeeze && column.refs.len() != 1 {
                return Err(ClientError::invalid(format!(
                    "Column {i} is squeezed but has {} references (must be exactly 1)",
                    column.refs.len()
                )));
            }
            let mut spec: Option<(i32, &Vec<i64>)> = None;
            let mut slices: Vec<ChunkSlice> = Vec::new();
            for &(c, step) in &column.refs {
                let col = self.columns.get(c).and_then(Option::as_ref);
                let cell = col.and_then(|col| col.cell(step)).ok_or_else(|| {
                    ClientError::invalid(format!(
                        "Column {i} of the item references step {step} of writer column {c}, which has \
                         expired (increase num_keep_alive_refs) or was never written"
                    ))
                })?;
                let col = col.expect("cell found");
                match spec {
                    None => spec = Some((col.dtype, &col.row_shape)),
                    Some((d, s)) if d != col.dtype || s != &col.row_shape => {
                        return Err(ClientError::invalid(format!(
                            "Column {i} of the item mixes references of different dtypes or shapes"
                        )))
                    }
                    _ => {}
                }
                match slices.last_mut() {
                    Some(last)
                        if last.chunk_key == cell.slot.key
                            && last.offset + last.length == cell.offset as i32 =>
                    {
                        last.length += 1
                    }
                    _ => slices.push(ChunkSlice {
                        chunk_key: cell.slot.key,
                        offset: cell.offset as i32,
                        length: 1,
                        index: 0,
                    }),
                }
                if !slots.iter().any(|s| s.key == cell.slot.key) {
                    slots.push(cell.slot.clone());
                }
            }
            flat.push(FlatColumn {
                chunk_slices: slices,
                squeeze: column.squeeze,
            });
        }
        let key: u64 = rand::random();
        let item = PrioritizedItem {
            key,
            table: table.to_string(),
            priority,
            flat_trajectory: Some(FlatTrajectory { columns: flat }),
            ..Default::default()
        };
        self.push_pending_front_or_back(item, slots, false);
        Ok(key)
    }

    /// Chunk keys the server must keep: finalized chunks of live cells and of queued items.
    fn keep_keys(&self) -> Vec<u64> {
        let mut seen: HashSet<u64> = HashSet::new();
        let mut keep: Vec<u64> = Vec::new();
        let mut add = |slot: &ChunkSlot| {
            if slot.data.get().is_some() && seen.insert(slot.key) {
                keep.push(slot.key);
            }
        };
        for col in self.columns.iter().flatten() {
            let mut last = None;
            for cell in &col.cells {
                if last != Some(cell.slot.key) {
                    add(&cell.slot);
                    last = Some(cell.slot.key);
                }
            }
        }
        for (slot, _) in self.pending_chunks.values() {
            add(slot);
        }
        keep
    }

    fn push_pending_front_or_back(
        &mut self,
        item: PrioritizedItem,
        slots: Vec<Arc<ChunkSlot>>,
        front: bool,
    ) {
        for slot in &slots {
            self.pending_chunks
                .entry(slot.key)
                .or_insert_with(|| (slot.clone(), 0))
                .1 += 1;
        }
        if front {
            self.pending.push_front((item, slots));
        } else {
            self.pending.push_back((item, slots));
        }
    }

    fn pop_pending(&mut self) -> Option<(PrioritizedItem, Vec<Arc<ChunkSlot>>)> {
        let (item, slots) = self.pending.pop_front()?;
        for slot in &slots {
            if let std::collections::hash_map::Entry::Occupied(mut e) =
                self.pending_chunks.entry(slot.key)
            {
                e.get_mut().1 -= 1;
                if e.get().1 == 0 {
                    e.remove();
                }
            }
        }
        Some((item, slots))
    }

    /// Sends ready items from the front of the queue. Returns false if it stopped at
    /// `deadline` because the in-flight window is full.
    fn pump(&mut self, deadline: Option<Instant>) -> Result<bool> {
        let window = self.options.max_in_flight_items.max(1) as u64;
        // Computed once per call: a superset of what each item sent here needs kept (the
        // chunks of items still queued included), which the next request trims.
        let mut keep: Option<Arc<Vec<u64>>> = None;
        while let Some((_, slots)) = self.pending.front() {
            if slots.iter().any(|s| s.data.get().is_none()) {
                return Ok(true);
            }
            // Wait for room in the in-flight window; confirmations (which make room) notify.
            {
                let mut progress = self.shared.progress.lock().unwrap();
                loop {
                    if let Some(e) = &progress.error {
                        return Err(e.clone());
                    }
                    if self.sent - progress.confirmed < window {
                        break;
                    }
                    // The window is full: the stream must send at once, not linger for more.
                    let _urgent = self.shared.urgent();
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Ok(false);
                    }
                    let wait = deadline.map_or(Duration::from_millis(100), |d| d - now);
                    progress = self.shared.changed.wait_timeout(progress, wait).unwrap().0;
                }
            }
            let keep = match &keep {
                Some(k) => k.clone(),
                None => keep.insert(Arc::new(self.keep_keys())).clone(),
            };
            let (item, slots) = self.pop_pending().expect("front exists");
            let chunks = slots
                .iter()
                .map(|s| s.data.get().expect("finalized").clone())
                .collect();
            let tx = self.tx.as_ref().ok_or_else(|| {
                ClientError::new(Code::FailedPrecondition, "The writer is closed")
            })?;
            if tx.send(Outgoing { item, chunks, keep }).is_err() {
                self.check_error()?;
                return Err(ClientError::new(
                    Code::Internal,
                    "The writer's insert stream stopped",
                ));
            }
            self.sent += 1;
        }
        Ok(true)
    }

    /// Sends queued items that are ready, waiting up to `deadline` for room in the in-flight
    /// window. Returns false if items ready to send remain.
    pub fn send_ready(&mut self, deadline: Option<Instant>) -> Result<bool> {
        self.check_error()?;
        self.pump(deadline)
    }

    /// Finalizes the open chunks that queued items wait for, so they can be sent.
    fn finalize_for_pending(&mut self) {
        let waiting: Vec<u64> = self
            .pending_chunks
            .values()
            .filter(|(s, _)| s.data.get().is_none())
            .map(|(s, _)| s.key)
            .collect();
        if waiting.is_empty() {
            return;
        }
        let columns: Vec<usize> = self
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                c.as_ref()
                    .and_then(|c| c.open.as_ref())
                    .is_some_and(|o| waiting.contains(&o.slot.key))
            })
            .map(|(i, _)| i)
            .collect();
        for c in columns {
            self.finalize(c);
        }
    }

    /// Items created but not yet confirmed by the server.
    pub fn unconfirmed(&self) -> u64 {
        self.sent + self.pending.len() as u64 - self.shared.progress.lock().unwrap().confirmed
    }

    /// Sends every queued item and waits until at most `block_until_num_items` are
    /// unconfirmed. Returns false if `deadline` passed first.
    pub fn flush(&mut self, block_until_num_items: u64, deadline: Option<Instant>) -> Result<bool> {
        self.check_error()?;
        let shared = self.shared.clone();
        let _urgent = shared.urgent();
        self.finalize_for_pending();
        if !self.pump(deadline)? {
            return Ok(false);
        }
        loop {
            let progress = self.shared.progress.lock().unwrap();
            if let Some(e) = &progress.error {
                return Err(e.clone());
            }
            if self.sent - progress.confirmed <= block_until_num_items {
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            let wait = deadline.map_or(Duration::from_millis(100), |d| d - now);
            let _ = self.shared.changed.wait_timeout(progress, wait).unwrap();
        }
    }

    /// Ends the episode: finalizes every chunk, flushes (waiting up to `deadline`), and starts
    /// a new episode. `clear_buffers` drops the history (all refs expire).
    pub fn end_episode(&mut self, clear_buffers: bool, deadline: Option<Instant>) -> Result<bool> {
        for c in 0..self.columns.len() {
            self.finalize(c);
        }
        if !self.flush(0, deadline)? {
            return Ok(false);
        }
        if self.step_open {
            self.step += 1;
        }
        let step = self.step;
        self.lanes = (0..self.lanes.len()).map(|_| Lane::new(step)).collect();
        self.step_open = false;
        if clear_buffers {
            for col in self.columns.iter_mut().flatten() {
                col.cells.clear();
            }
        }
        Ok(true)
    }

    /// Stops the insert stream (after sending what is queued and ready). Items waiting for
    /// unfinalized chunks are dropped, as in the reference.
    pub fn close(&mut self) {
        let shared = self.shared.clone();
        let _urgent = shared.urgent();
        let _ = self.pump(Some(Instant::now() + Duration::from_secs(1)));
        self.pending.clear();
        self.pending_chunks.clear();
        self.tx = None;
    }

    /// Whether the insert stream has failed for good (every call will return its error).
    pub fn failed(&self) -> bool {
        self.check_error().is_err()
    }

    /// Stops at once: drops queued items and cancels the insert stream, so items the server
    /// has not stored yet (e.g. waiting on a full table) are never stored.
    pub fn abort(&mut self) {
        self.pending.clear();
        self.pending_chunks.clear();
        self.tx = None;
        self.task.abort();
    }

    /// A writer of `lanes` parallel episodes, one per environment of a vectorised
    /// environment: field `f` of lane `l` is column `f * lanes + l`, each lane has its own
    /// episode, and every `append_lanes` adds one step to each.
    pub fn with_lanes(client: Client, options: WriterOptions, lanes: usize) -> Result<Self> {
        if lanes < 1 {
            return Err(ClientError::invalid(format!(
                "num_envs ({lanes}) must be >= 1"
            )));
        }
        let mut writer = Self::new(client, options)?;
        writer.lanes = (0..lanes).map(|_| Lane::new(0)).collect();
        Ok(writer)
    }

    /// Number of parallel episodes.
    pub fn num_lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Steps appended in each lane's episode.
    pub fn lane_steps(&self) -> Vec<u64> {
        self.lanes.iter().map(|l| self.step - l.start).collect()
    }

    /// Writer-wide step of each lane's first episode step (cells are addressed by it).
    pub fn lane_starts(&self) -> Vec<u64> {
        self.lanes.iter().map(|l| l.start).collect()
    }

    /// Appends one step to every lane: each value `(field, tensor)` has a leading dimension
    /// of `num_lanes()`, row `l` going to lane `l`. Errors name the field; a failed call
    /// changes nothing.
    pub fn append_lanes(
        &mut self,
        values: Vec<(usize, Tensor)>,
    ) -> std::result::Result<(), AppendError> {
        self.check_error().map_err(AppendError::Other)?;
        let n = self.lanes.len();
        for (i, (field, value)) in values.iter().enumerate() {
            if values[..i].iter().any(|(f, _)| f == field) {
                return Err(AppendError::AlreadySet(*field));
            }
            if value.shape.first().copied() != Some(n as i64) {
                return Err(AppendError::Other(ClientError::invalid(format!(
                    "Every value needs a leading dimension of num_envs ({n}); field {field} has shape {:?}",
                    value.shape
                ))));
            }
            if let Some(Some(col)) = self.columns.get(field * n) {
                if col.dtype != value.dtype || col.row_shape[..] != value.shape[1..] {
                    return Err(AppendError::Mismatch {
                        column: *field,
                        expected: (col.dtype, col.row_shape.clone()),
                        got: (value.dtype, value.shape[1..].to_vec()),
                    });
                }
            }
            if dtype_size(value.dtype).is_none() {
                return Err(AppendError::Other(ClientError::invalid(format!(
                    "Unsupported dtype {}",
                    value.dtype
                ))));
            }
        }
        let step = self.step;
        for (field, value) in &values {
            let row_bytes = value.row_bytes();
            for lane in 0..n {
                let row = &value.data[lane * row_bytes..(lane + 1) * row_bytes];
                self.push_row(field * n + lane, step, value.dtype, &value.shape[1..], row);
            }
        }
        self.step += 1;
        Ok(())
    }

    /// Ends the episodes of `lanes`: finalizes their chunks (so their items can leave) and
    /// starts new episodes there; `clear_buffers` drops their history. Does not wait for
    /// confirmations (`flush` does).
    pub fn end_lanes(&mut self, lanes: &[usize], clear_buffers: bool) -> Result<()> {
        self.check_error()?;
        let n = self.lanes.len();
        if let Some(bad) = lanes.iter().find(|&&l| l >= n) {
            return Err(ClientError::invalid(format!(
                "env index {bad} out of range for num_envs {n}"
            )));
        }
        for &lane in lanes {
            for column in (lane..self.columns.len()).step_by(n) {
                self.finalize(column);
                if clear_buffers {
                    if let Some(col) = self.columns[column].as_mut() {
                        col.cells.clear();
                    }
                }
            }
            self.lanes[lane] = Lane::new(self.step);
        }
        self.pump(Some(Instant::now())).map(|_| ())
    }

    /// Creates one item in `table` per lane of `lanes`, each from that lane's episode:
    /// `columns` are `(field, steps, squeeze)`. `priorities` has one value per lane, or one for
    /// all. Checks every item before queuing any. Returns false if it stopped waiting for room
    /// in the in-flight window at `deadline` (the items are queued regardless).
    pub fn create_lane_items(
        &mut self,
        table: &str,
        priorities: &[f64],
        lanes: &[usize],
        columns: &[(usize, Steps, bool)],
        deadline: Option<Instant>,
    ) -> Result<bool> {
        self.check_error()?;
        let n = self.lanes.len();
        if priorities.len() != 1 && priorities.len() != lanes.len() {
            return Err(ClientError::invalid(format!(
                "Got {} priorities for {} envs (give one, or one per env)",
                priorities.len(),
                lanes.len()
            )));
        }
        let mut items = Vec::with_capacity(lanes.len());
        for &lane in lanes {
            if lane >= n {
                return Err(ClientError::invalid(format!(
                    "env index {lane} out of range for num_envs {n}"
                )));
            }
            let Lane { start, .. } = self.lanes[lane];
            let len = (self.step - start) as i64;
            let mut item = Vec::with_capacity(columns.len());
            for (i, (field, steps, squeeze)) in columns.iter().enumerate() {
                let column = field * n + lane;
                let refs = steps
                    .resolve(len)
                    .map_err(|e| ClientError::invalid(format!("Column {i}, env {lane}: {e}")))?
                    .into_iter()
                    .map(|s| (column, start + s as u64))
                    .collect::<Vec<_>>();
                if refs.is_empty() || (*squeeze && refs.len() != 1) {
                    return Err(ClientError::invalid(format!(
                        "Column {i}, env {lane}: selects {} steps of {len}{}",
                        refs.len(),
                        if *squeeze {
                            " (a squeezed column needs exactly 1)"
                        } else {
                            ""
                        }
                    )));
                }
                if let Some(&(_, step)) = refs.iter().find(|&&(c, s)| !self.alive(c, &[s])[0]) {
                    return Err(ClientError::invalid(format!(
                        "Column {i}, env {lane}: episode step {} has expired (increase \
                         num_keep_alive_refs) or was never written",
                        step - start
                    )));
                }
                item.push(ItemColumn {
                    refs,
                    squeeze: *squeeze,
                });
            }
            items.push(item);
        }
        for (i, item) in items.iter().enumerate() {
            let priority = priorities[if priorities.len() == 1 { 0 } else { i }];
            self.queue_item(table, priority, item)?;
        }
        self.pump(deadline)
    }

    /// The client this writer sends through.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl Drop for TrajectoryWriter {
    fn drop(&mut self) {
        self.tx = None;
    }
}

#[cfg(test)]
mod tests {
    use super::Steps;

    /// Python's `list(range(len))[index]` for the cases `Steps` mirrors.
    #[test]
    fn steps_resolve_like_python_indexing() {
        type Case = (Steps, i64, Result<Vec<i64>, ()>);
        let cases: &[Case] = &[
            (Steps::Index(-1), 5, Ok(vec![4])),
            (Steps::Index(0), 5, Ok(vec![0])),
            (Steps::Index(5), 5, Err(())),
            (Steps::Index(-6), 5, Err(())),
            (Steps::Slice(Some(-2), None, None), 5, Ok(vec![3, 4])),
            (Steps::Slice(Some(-2), None, None), 1, Ok(vec![0])),
            (Steps::Slice(None, None, None), 3, Ok(vec![0, 1, 2])),
            (
                Steps::Slice(Some(1), Some(10), Some(2)),
                6,
                Ok(vec![1, 3, 5]),
            ),
            (Steps::Slice(None, None, Some(-1)), 3, Ok(vec![2, 1, 0])),
            (
                Steps::Slice(Some(-1), Some(-4), Some(-2)),
                5,
                Ok(vec![4, 2]),
            ),
            (Steps::Slice(Some(10), None, Some(-1)), 3, Ok(vec![2, 1, 0])),
            (Steps::Slice(Some(-10), Some(2), None), 5, Ok(vec![0, 1])),
            (Steps::Slice(Some(3), Some(1), None), 5, Ok(vec![])),
            (Steps::Slice(None, None, Some(0)), 5, Err(())),
            (Steps::List(vec![0, -1, 2]), 4, Ok(vec![0, 3, 2])),
            (Steps::List(vec![4]), 4, Err(())),
            (Steps::Slice(Some(1), None, Some(i64::MAX)), 5, Ok(vec![1])),
            (Steps::Slice(None, None, Some(i64::MIN)), 5, Ok(vec![4])),
        ];
        for (steps, len, want) in cases {
            let got = steps.resolve(*len).map_err(|_| ());
            assert_eq!(&got, want, "{steps:?} of {len}");
        }
    }
}
