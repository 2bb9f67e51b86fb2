//! Chunks and items. A chunk is stored exactly as it arrived (its tensor payload stays encoded)
//! and is shared through `Arc` by every item that references it, in any table; it is freed when
//! the last such item is gone.

use crate::chunk_store::ChunkStore;
use bytes::Bytes;
use reverb_proto::held::{ChunkView, SliceView, StoredItem};
use reverb_proto::payload::{dtype_name, Layout};
use reverb_proto::{flat_trajectory, ChunkData, FlatTrajectory, PrioritizedItem, SequenceRange};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Chunks alive in this process, and their payload bytes (see [`Chunk::held`]).
static HELD: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));

/// One column's rows of one episode range, as encoded bytes. Holds the fields of its
/// `ChunkData` packed (not the message itself: the tables of RL replay hold millions of small
/// chunks, and the message with its `Bytes` took 32 bytes more of each).
#[derive(Debug)]
pub struct Chunk {
    key: u64,
    episode_id: u64,
    start: i32,
    end: i32,
    uncompressed_size: i64,
    tensors_len: i32,
    /// [`HAS_RANGE`], [`SPARSE`], [`DELTA_ENCODED`].
    flags: u8,
    /// Copied, never kept as the slice of a larger buffer it arrived in (the request's, or
    /// a compressor's output with spare capacity), which it would keep alive for as long
    /// as the chunk is stored.
    payload: Payload,
}

/// Payloads of up to this many bytes are held in the chunk's record: a small step's chunk
/// (one row of a column, ~50 bytes) is then one allocation, read with its record (the
/// gather of a batch of small items reads a record and a payload per column and item).
const INLINE_PAYLOAD: usize = 62;

/// A chunk's payload: in its record when small, else in an allocation of its own, or (a
/// server storing chunks on disk) in a [`ChunkStore`], read through its cache.
enum Payload {
    Inline(u8, [u8; INLINE_PAYLOAD]),
    Heap(Box<[u8]>),
    /// In the store, with its length; nothing of it in memory.
    Stored(Arc<ChunkStore>, usize),
    /// Read back from the store into a buffer it lent (the payload is all of it; its
    /// capacity may be larger): given back when the chunk goes, for the next read of a
    /// payload of about that size (see [`ChunkStore::give_back`]).
    Lent(Vec<u8>, Arc<ChunkStore>),
}

impl Payload {
    fn new(bytes: &[u8]) -> Self {
        match u8::try_from(bytes.len()) {
            Ok(len) if bytes.len() <= INLINE_PAYLOAD => {
                let mut inline = [0u8; INLINE_PAYLOAD];
                inline[..bytes.len()].copy_from_slice(bytes);
                Payload::Inline(len, inline)
            }
            _ => Payload::Heap(Box::from(bytes)),
        }
    }
}

impl Payload {
    /// The bytes held in memory: none of a stored payload (read it with
    /// [`Chunk::resident`]).
    fn held(&self) -> &[u8] {
        match self {
            Payload::Inline(len, bytes) => &bytes[..*len as usize],
            Payload::Heap(bytes) => bytes,
            Payload::Lent(bytes, _) => bytes,
            Payload::Stored(..) => &[],
        }
    }

    fn len(&self) -> usize {
        match self {
            Payload::Stored(_, len) => *len,
            held => held.held().len(),
        }
    }
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Payload::Stored(..) => write!(f, "{} bytes on disk", self.len()),
            _ => write!(f, "{} bytes", self.len()),
        }
    }
}

/// The chunk has a `sequence_range`.
const HAS_RANGE: u8 = 1;
/// `sequence_range.sparse`.
const SPARSE: u8 = 2;
/// `delta_encoded`.
const DELTA_ENCODED: u8 = 4;

/// A chunk's payload as `Bytes` for the wire, sharing the chunk's allocation.
struct SharedPayload(Arc<Chunk>);

impl AsRef<[u8]> for SharedPayload {
    fn as_ref(&self) -> &[u8] {
        self.0.payload.held()
    }
}

impl Chunk {
    /// Stores a received chunk (its payload copied into an allocation of its own; the
    /// transport-only shared-memory fields are dropped).
    pub fn new(data: ChunkData) -> Self {
        let payload = Payload::new(&data.data);
        Self::with_payload(data, payload)
    }

    fn with_payload(data: ChunkData, payload: Payload) -> Self {
        HELD.0.fetch_add(1, Ordering::Relaxed);
        HELD.1.fetch_add(payload.held().len(), Ordering::Relaxed);
        let range = data.sequence_range.unwrap_or_default();
        let flags = chunk_flags(&data);
        Self {
            key: data.chunk_key,
            episode_id: range.episode_id,
            start: range.start,
            end: range.end,
            uncompressed_size: data.data_uncompressed_size,
            tensors_len: data.data_tensors_len,
            flags,
            payload,
        }
    }

    /// A chunk whose payload `store` holds (the store wrote it): its fields from `data`, its
    /// payload's length.
    pub(crate) fn stored(data: ChunkData, store: Arc<ChunkStore>) -> Self {
        let len = data.data.len();
        Self::with_payload(
            ChunkData {
                data: Bytes::new(),
                ..data
            },
            Payload::Stored(store, len),
        )
    }

    /// This chunk (fields and key) with `payload` read back from `store` into a buffer it
    /// lent (see [`Payload::Lent`]), in memory.
    pub(crate) fn with_lent(&self, payload: Vec<u8>, store: Arc<ChunkStore>) -> Self {
        HELD.0.fetch_add(1, Ordering::Relaxed);
        HELD.1.fetch_add(payload.len(), Ordering::Relaxed);
        Self {
            payload: Payload::Lent(payload, store),
            ..*self
        }
    }

    /// The chunk `key` whose other fields are `header` (see [`Chunk::header`]), with its
    /// payload in memory or (`Err(len)`) in `store`. None when the header is not one.
    pub(crate) fn from_header(
        key: u64,
        header: &[u8; STORED_HEADER],
        payload: Result<&[u8], (Arc<ChunkStore>, usize)>,
    ) -> Option<Self> {
        if header[0] != 1 {
            return None;
        }
        let flags = header[29];
        let data = ChunkData {
            chunk_key: key,
            sequence_range: (flags & HAS_RANGE != 0).then(|| SequenceRange {
                episode_id: u64::from_le_bytes(header[1..9].try_into().expect("8 bytes")),
                start: i32::from_le_bytes(header[9..13].try_into().expect("4 bytes")),
                end: i32::from_le_bytes(header[13..17].try_into().expect("4 bytes")),
                sparse: flags & SPARSE != 0,
            }),
            data_uncompressed_size: i64::from_le_bytes(header[17..25].try_into().expect("8")),
            data_tensors_len: i32::from_le_bytes(header[25..29].try_into().expect("4 bytes")),
            delta_encoded: flags & DELTA_ENCODED != 0,
            ..Default::default()
        };
        Some(match payload {
            Ok(bytes) => Self::with_payload(data, Payload::new(bytes)),
            Err((store, len)) => Self::with_payload(data, Payload::Stored(store, len)),
        })
    }

    /// Whether its payload stays in memory when a chunk store holds chunks: small ones do
    /// (in the chunk's own record, they cost no memory of their own).
    pub(crate) fn kept_in_memory(data: &ChunkData) -> bool {
        data.data.len() <= INLINE_PAYLOAD
    }

    /// The chunk with its payload in memory: itself, or (stored on disk) a copy read through
    /// its store's cache. Fails when the store cannot read it back whole.
    pub fn resident(self: &Arc<Self>) -> std::io::Result<Arc<Chunk>> {
        self.in_memory(true)
    }

    /// [`Chunk::resident`] without keeping what it reads in the cache (a checkpoint reads
    /// every chunk once: it must not push out what sampling reads).
    pub fn read_once(self: &Arc<Self>) -> std::io::Result<Arc<Chunk>> {
        self.in_memory(false)
    }

    fn in_memory(self: &Arc<Self>, cache: bool) -> std::io::Result<Arc<Chunk>> {
        match &self.payload {
            Payload::Stored(store, _) => store.load(self, cache),
            _ => Ok(self.clone()),
        }
    }

    /// Starts reading its payload from disk if it is there and not in the cache (reading it
    /// with [`Chunk::resident`] then waits less).
    pub fn will_need(&self) {
        if let Payload::Stored(store, _) = &self.payload {
            store.will_need(self);
        }
    }

    /// Whether its payload is on disk, not in memory.
    pub fn is_stored(&self) -> bool {
        matches!(self.payload, Payload::Stored(..))
    }

    /// The store holding its payload, if it is on disk.
    pub(crate) fn store(&self) -> Option<&Arc<ChunkStore>> {
        match &self.payload {
            Payload::Stored(store, _) => Some(store),
            _ => None,
        }
    }

    /// Its fields other than the key and payload, as a chunk store writes them before the
    /// payload: `[1][episode_id][start][end][uncompressed_size][tensors_len][flags]`.
    pub(crate) fn header(&self) -> [u8; STORED_HEADER] {
        header_bytes(
            self.episode_id,
            self.start,
            self.end,
            self.uncompressed_size,
            self.tensors_len,
            self.flags,
        )
    }

    /// [`Chunk::header`] of the chunk `data` makes.
    pub(crate) fn header_of(data: &ChunkData) -> [u8; STORED_HEADER] {
        let range = data.sequence_range.unwrap_or_default();
        header_bytes(
            range.episode_id,
            range.start,
            range.end,
            data.data_uncompressed_size,
            data.data_tensors_len,
            chunk_flags(data),
        )
    }

    /// Chunks alive in this process (held by tables, insert streams or samples in flight)
    /// and the bytes of their payloads.
    pub fn held() -> (usize, usize) {
        (
            HELD.0.load(Ordering::Relaxed),
            HELD.1.load(Ordering::Relaxed),
        )
    }
    /// The chunk's random key.
    pub fn key(&self) -> u64 {
        self.key
    }
    /// The episode the chunk's rows belong to.
    pub fn episode_id(&self) -> u64 {
        self.episode_id
    }
    /// The chunk as it goes back on the wire (its payload shared, not copied).
    pub fn data(self: &Arc<Self>) -> ChunkData {
        ChunkData {
            chunk_key: self.key,
            sequence_range: (self.flags & HAS_RANGE != 0).then_some(SequenceRange {
                episode_id: self.episode_id,
                start: self.start,
                end: self.end,
                sparse: self.flags & SPARSE != 0,
            }),
            data: Bytes::from_owner(SharedPayload(self.clone())),
            data_tensors_len: self.tensors_len,
            data_uncompressed_size: self.uncompressed_size,
            delta_encoded: self.flags & DELTA_ENCODED != 0,
            ..Default::default()
        }
    }
    /// The encoded payload held in memory (empty when it is on disk: see
    /// [`Chunk::resident`]).
    pub fn payload(&self) -> &[u8] {
        self.payload.held()
    }
    /// Bytes of encoded payload (what a sample response carries).
    pub fn byte_size(&self) -> usize {
        self.payload.len()
    }
    /// The rows its range spans (`end - start + 1`) when it has a dense one (not sparse).
    fn dense_rows(&self) -> Option<i32> {
        if self.flags & (HAS_RANGE | SPARSE) != HAS_RANGE || self.end < self.start {
            return None;
        }
        self.end.checked_sub(self.start)?.checked_add(1)
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        HELD.0.fetch_sub(1, Ordering::Relaxed);
        HELD.1
            .fetch_sub(self.payload.held().len(), Ordering::Relaxed);
        match &mut self.payload {
            Payload::Stored(store, _) => store.forget(self.key),
            Payload::Lent(bytes, store) => store.give_back(std::mem::take(bytes)),
            _ => {}
        }
    }
}

/// [`Chunk::header`]'s bytes.
fn header_bytes(
    episode_id: u64,
    start: i32,
    end: i32,
    uncompressed_size: i64,
    tensors_len: i32,
    flags: u8,
) -> [u8; STORED_HEADER] {
    let mut out = [0u8; STORED_HEADER];
    out[0] = 1;
    out[1..9].copy_from_slice(&episode_id.to_le_bytes());
    out[9..13].copy_from_slice(&start.to_le_bytes());
    out[13..17].copy_from_slice(&end.to_le_bytes());
    out[17..25].copy_from_slice(&uncompressed_size.to_le_bytes());
    out[25..29].copy_from_slice(&tensors_len.to_le_bytes());
    out[29] = flags;
    out
}

/// The flags of the chunk `data` makes.
fn chunk_flags(data: &ChunkData) -> u8 {
    let mut flags = 0;
    if let Some(range) = &data.sequence_range {
        flags |= HAS_RANGE;
        if range.sparse {
            flags |= SPARSE;
        }
    }
    if data.delta_encoded {
        flags |= DELTA_ENCODED;
    }
    flags
}

/// Bytes of [`Chunk::header`].
pub(crate) const STORED_HEADER: usize = 30;

/// An item's columns as chunk slices, held in one allocation: the wire form
/// (`FlatTrajectory`) takes one per column and one more, which for the small items of RL
/// replay is a large part of what a stored item costs. A slice names its chunk by position
/// in the item's chunk list (see [`ItemData::chunks`]), not by key. A column running through
/// consecutive chunks of dense ranges (to the end of each but the last, from the start of each
/// but the first: what writers make) is one slice, a run, split again by the chunks' rows
/// when the wire form is asked for: a 10-step item of 2-step frame chunks holds one slice
/// rather than five or six.
#[derive(Debug, Clone)]
pub struct Trajectory(Slices);

impl PartialEq for Trajectory {
    fn eq(&self, other: &Self) -> bool {
        self.slices().eq(other.slices())
    }
}

/// A trajectory's slices: one (an item of one column kept as one run, as frame items are)
/// held inline, more in an allocation of their own, or those of an item run shared by its
/// items (see [`RunShape`]), whose rows item `i` of the run finds `i` rows further.
#[derive(Debug, Clone)]
enum Slices {
    One(Slice),
    Many(Box<[Slice]>),
    Shifted(Arc<[Slice]>, i32),
}

/// One chunk slice of a column, or the place of a column that has none.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Slice {
    offset: i32,
    length: i32,
    index: i32,
    /// The chunk's position in the item's chunk list, with the flags above `FLAG_SHIFT`.
    chunk: u32,
}

const FLAG_SHIFT: u32 = 28;
/// The slice starts a column.
const FIRST: u32 = 1 << FLAG_SHIFT;
/// The column it starts is squeezed.
const SQUEEZE: u32 = 2 << FLAG_SHIFT;
/// A column without slices (only its flags mean anything).
const EMPTY: u32 = 4 << FLAG_SHIFT;
/// A run: `length` rows from `offset` in the chunk at its position, continuing from the
/// start of each next chunk (by position) until `length` is used up.
const RUN: u32 = 8 << FLAG_SHIFT;
/// One column of the items of an item run (see [`RunShape`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRef {
    /// The chunk's position in the items' chunk list.
    pub chunk: u32,
    /// The tensor of the chunk.
    pub index: i32,
    /// The row of the tensor item 0 of the run holds.
    pub row: i32,
    /// The column is squeezed (the row itself, not a batch of one).
    pub squeeze: bool,
}

/// The columns of the items of an item run, one row each, shared by them: item `i` holds
/// row `row + i` of each column's tensor (see [`ItemData::of_run`]).
#[derive(Debug, Clone)]
pub struct RunShape(Arc<[Slice]>);

impl RunShape {
    /// The shape of a run whose item 0 holds `rows` (at least one column).
    pub fn new(rows: &[RowRef]) -> Self {
        debug_assert!(!rows.is_empty());
        Self(
            rows.iter()
                .map(|r| Slice {
                    offset: r.row,
                    length: 1,
                    index: r.index,
                    chunk: r.chunk | FIRST | if r.squeeze { SQUEEZE } else { 0 },
                })
                .collect(),
        )
    }
}

/// Most chunks an item may reference.
pub const MAX_ITEM_CHUNKS: usize = 1 << FLAG_SHIFT;

impl Trajectory {
    /// The compact form of `trajectory`, whose slices reference `chunks` (by key). Errs if a
    /// slice's chunk is not among them or there are more than [`MAX_ITEM_CHUNKS`].
    pub fn new(trajectory: &FlatTrajectory, chunks: &[Arc<Chunk>]) -> Result<Self, String> {
        if chunks.len() > MAX_ITEM_CHUNKS {
            return Err(format!(
                "references {} chunks, more than {MAX_ITEM_CHUNKS}",
                chunks.len()
            ));
        }
        let by_key: Option<std::collections::HashMap<u64, u32>> =
            (chunks.len() > 16).then(|| (0u32..).zip(chunks).map(|(i, c)| (c.key(), i)).collect());
        let position = |key: u64| -> Result<u32, String> {
            let found = match &by_key {
                Some(map) => map.get(&key).copied(),
                None => chunks.iter().position(|c| c.key() == key).map(|i| i as u32),
            };
            found.ok_or_else(|| format!("references chunk {key}, which it does not hold"))
        };
        let mut slices = Vec::with_capacity(
            trajectory
                .columns
                .iter()
                .map(|c| c.chunk_slices.len().max(1))
                .sum(),
        );
        for column in &trajectory.columns {
            let squeeze = if column.squeeze { SQUEEZE } else { 0 };
            if column.chunk_slices.is_empty() {
                slices.push(Slice {
                    offset: 0,
                    length: 0,
                    index: 0,
                    chunk: FIRST | squeeze | EMPTY,
                });
            }
            // The chunk the column's last slice ends at the end of, if it does: the next
            // slice may continue it as a run.
            let mut run_end: Option<u32> = None;
            for (i, s) in column.chunk_slices.iter().enumerate() {
                let at = position(s.chunk_key)?;
                let rows = chunks[at as usize].dense_rows();
                match slices.last_mut() {
                    Some(last)
                        if run_end.is_some_and(|end| end + 1 == at)
                            && last.index == s.index
                            && s.offset == 0
                            && s.length >= 1
                            && rows.is_some_and(|rows| s.length <= rows)
                            && last.length.checked_add(s.length).is_some() =>
                    {
                        last.length += s.length;
                        last.chunk |= RUN;
                    }
                    _ => {
                        let flags = if i == 0 { FIRST | squeeze } else { 0 };
                        slices.push(Slice {
                            offset: s.offset,
                            length: s.length,
                            index: s.index,
                            chunk: at | flags,
                        });
                    }
                }
                let ends_chunk = s.length >= 1
                    && rows.is_some_and(|rows| s.offset.checked_add(s.length) == Some(rows));
                run_end = ends_chunk.then_some(at);
            }
        }
        Ok(Self(match slices[..] {
            [one] => Slices::One(one),
            _ => Slices::Many(slices.into_boxed_slice()),
        }))
    }

    fn slices(&self) -> impl ExactSizeIterator<Item = Slice> + '_ {
        let (slices, shift) = match &self.0 {
            Slices::One(one) => (std::slice::from_ref(one), 0),
            Slices::Many(many) => (&many[..], 0),
            Slices::Shifted(shared, shift) => (&shared[..], *shift),
        };
        slices.iter().map(move |s| Slice {
            offset: s.offset + shift,
            ..*s
        })
    }

    /// Calls `f` with every slice of every column (runs split again by their chunks'
    /// rows), with `chunks` the list it was made with.
    fn for_each_slice(&self, chunks: &[Arc<Chunk>], f: &mut dyn FnMut(SliceView)) {
        let mut column = usize::MAX; // (the first slice starts column 0)
        let mut squeeze = false;
        for s in self.slices() {
            if s.chunk & FIRST != 0 {
                column = column.wrapping_add(1);
                squeeze = s.chunk & SQUEEZE != 0;
            }
            if s.chunk & EMPTY != 0 {
                continue;
            }
            let mut position = (s.chunk & (FIRST - 1)) as usize;
            let view = |chunk: usize, offset: i32, length: i32| SliceView {
                column,
                squeeze,
                chunk,
                index: s.index as usize,
                offset: offset as usize,
                length: length as usize,
            };
            if s.chunk & RUN == 0 {
                f(view(position, s.offset, s.length));
                continue;
            }
            // A run was made only of pieces these rows reproduce exactly.
            let (mut offset, mut left) = (s.offset, s.length);
            while left > 0 {
                let rows = chunks[position]
                    .dense_rows()
                    .expect("a run's chunks have dense ranges");
                let length = left.min(rows - offset);
                f(view(position, offset, length));
                left -= length;
                offset = 0;
                position += 1;
            }
        }
    }

    /// How many columns it has.
    fn columns(&self) -> usize {
        self.slices().filter(|s| s.chunk & FIRST != 0).count()
    }

    /// The wire form, with the keys of `chunks` (the list it was made with).
    pub fn to_proto(&self, chunks: &[Arc<Chunk>]) -> FlatTrajectory {
        let mut columns: Vec<flat_trajectory::Column> = self
            .slices()
            .filter(|s| s.chunk & FIRST != 0)
            .map(|s| flat_trajectory::Column {
                chunk_slices: Vec::new(),
                squeeze: s.chunk & SQUEEZE != 0,
            })
            .collect();
        self.for_each_slice(chunks, &mut |s| {
            columns[s.column]
                .chunk_slices
                .push(flat_trajectory::ChunkSlice {
                    chunk_key: chunks[s.chunk].key(),
                    offset: s.offset as i32,
                    length: s.length as i32,
                    index: s.index as i32,
                })
        });
        FlatTrajectory { columns }
    }
}

/// `at` in nanoseconds since the Unix epoch (saturating; 1 for the epoch itself, so that it
/// stays distinct from "not set").
fn timestamp_ns(at: &prost_types::Timestamp) -> i64 {
    let ns = at
        .seconds
        .saturating_mul(1_000_000_000)
        .saturating_add(i64::from(at.nanos));
    if ns == 0 {
        1
    } else {
        ns
    }
}

/// The immutable part of an item, shared between a table and in-flight samples. (Its table
/// is the one holding it: the name is not stored with every item.)
#[derive(Debug, Clone)]
pub struct ItemData {
    /// The item's key.
    pub key: u64,
    /// The columns as chunk slices (of `chunks`: the two are kept together).
    trajectory: Trajectory,
    /// When the table stored it, in nanoseconds since the Unix epoch (0: not yet; see
    /// [`ItemData::inserted_at`]).
    inserted_at_ns: i64,
    /// The chunks the trajectory references, in order of first reference (shared by the
    /// items of an item run).
    chunks: Arc<[Arc<Chunk>]>,
}

impl ItemData {
    /// Bytes of the chunks it references.
    pub fn byte_size(&self) -> usize {
        self.chunks.iter().map(|c| c.byte_size()).sum()
    }

    /// Builds an item from its wire form and the chunks it references (every chunk a slice
    /// names must be among them).
    pub fn from_proto(item: &PrioritizedItem, chunks: Vec<Arc<Chunk>>) -> Result<Self, String> {
        let empty = FlatTrajectory::default();
        let trajectory = item.flat_trajectory.as_ref().unwrap_or(&empty);
        let mut data = Self::new(item.key, trajectory, chunks)?;
        if let Some(at) = &item.inserted_at {
            data.set_inserted_at(at);
        }
        Ok(data)
    }

    /// Item `i` of an item run of `shape` over `chunks` (each chunk once, in order of first
    /// reference). The caller has checked that every row exists, `row + i` included (see the
    /// server's insert stream). Items of one run share `shape` and `chunks`.
    pub fn of_run(key: u64, chunks: Arc<[Arc<Chunk>]>, shape: &RunShape, i: i32) -> Self {
        debug_assert!(chunks.len() <= MAX_ITEM_CHUNKS);
        let slices = match &shape.0[..] {
            [one] => Slices::One(Slice {
                offset: one.offset + i,
                ..*one
            }),
            _ => Slices::Shifted(shape.0.clone(), i),
        };
        Self {
            key,
            trajectory: Trajectory(slices),
            inserted_at_ns: 0,
            chunks,
        }
    }

    /// The chunks the item references, in order of first reference.
    pub fn chunks(&self) -> &[Arc<Chunk>] {
        &self.chunks
    }

    /// The item with every chunk's payload in memory (see [`Chunk::resident`]), or None
    /// when they all are already. Fails (naming the chunk) when one cannot be read back.
    pub fn resident(&self) -> std::io::Result<Option<ItemData>> {
        if !self.chunks.iter().any(|c| c.is_stored()) {
            return Ok(None);
        }
        let chunks = self
            .chunks
            .iter()
            .map(Chunk::resident)
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Some(self.with_chunks(chunks.into())))
    }

    /// The item over `chunks` (the same keys, in the same order: another form of each).
    pub fn with_chunks(&self, chunks: Arc<[Arc<Chunk>]>) -> ItemData {
        debug_assert!(self
            .chunks
            .iter()
            .zip(chunks.iter())
            .all(|(a, b)| a.key == b.key));
        Self {
            key: self.key,
            trajectory: self.trajectory.clone(),
            inserted_at_ns: self.inserted_at_ns,
            chunks,
        }
    }

    /// When the table stored it (None before).
    pub fn inserted_at(&self) -> Option<prost_types::Timestamp> {
        (self.inserted_at_ns != 0).then(|| prost_types::Timestamp {
            seconds: self.inserted_at_ns.div_euclid(1_000_000_000),
            nanos: self.inserted_at_ns.rem_euclid(1_000_000_000) as i32,
        })
    }

    /// Records when the table stored it.
    pub fn set_inserted_at(&mut self, at: &prost_types::Timestamp) {
        self.inserted_at_ns = timestamp_ns(at);
    }

    /// An item of `trajectory` (slices of `chunks`); see [`ItemData::from_proto`].
    pub fn new(
        key: u64,
        trajectory: &FlatTrajectory,
        chunks: Vec<Arc<Chunk>>,
    ) -> Result<Self, String> {
        Ok(Self {
            key,
            trajectory: Trajectory::new(trajectory, &chunks)?,
            inserted_at_ns: 0,
            chunks: chunks.into(),
        })
    }

    /// The wire form, in `table`, with the given mutable fields.
    pub fn to_proto(&self, table: &str, priority: f64, times_sampled: i32) -> PrioritizedItem {
        PrioritizedItem {
            key: self.key,
            table: table.to_string(),
            priority,
            times_sampled,
            inserted_at: self.inserted_at(),
            flat_trajectory: Some(self.trajectory.to_proto(&self.chunks)),
            deprecated_chunk_keys: Vec::new(),
            deprecated_sequence_range: None,
        }
    }
}

/// Why an item cannot be made of the chunks it references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemError {
    /// It references a chunk that is not there (its key).
    MissingChunk(u64),
    /// Its trajectory does not fit its chunks (the message says how).
    Invalid(String),
}

impl ItemData {
    /// The item `item` describes, checked against the tensors of the chunks it references
    /// (`chunk(key)`: a chunk and its tensors' layouts): every column has slices, every
    /// slice lies within its tensor's rows, a column joins rows of one dtype and row shape,
    /// a squeezed column is one row. What a server stores (and restores) can be served.
    pub fn checked<'a>(
        item: &PrioritizedItem,
        chunk: impl Fn(u64) -> Option<(&'a Arc<Chunk>, &'a [Layout])>,
    ) -> Result<Self, ItemError> {
        let key = item.key;
        let invalid = |what: String| ItemError::Invalid(what);
        let trajectory = item
            .flat_trajectory
            .as_ref()
            .ok_or_else(|| invalid(format!("Item {key} has no flat_trajectory")))?;
        if trajectory.columns.is_empty() {
            return Err(invalid(format!("Item {key} has no columns")));
        }
        let mut used: Vec<Arc<Chunk>> = Vec::new();
        for (i, column) in trajectory.columns.iter().enumerate() {
            let bad = |what: String| invalid(format!("Column {i} of item {key} {what}"));
            if column.chunk_slices.is_empty() {
                return Err(bad("has no chunk slices".into()));
            }
            if column.squeeze
                && (column.chunk_slices.len() != 1 || column.chunk_slices[0].length != 1)
            {
                return Err(bad(
                    "is squeezed but does not reference exactly one row".into()
                ));
            }
            let mut first: Option<&Layout> = None;
            for slice in &column.chunk_slices {
                if slice.offset < 0 || slice.length < 1 || slice.index < 0 {
                    return Err(bad(format!(
                        "has an invalid chunk slice (offset {}, length {}, index {})",
                        slice.offset, slice.length, slice.index
                    )));
                }
                let (stored, tensors) =
                    chunk(slice.chunk_key).ok_or(ItemError::MissingChunk(slice.chunk_key))?;
                let tensor = tensors.get(slice.index as usize).ok_or_else(|| {
                    bad(format!(
                        "references tensor {} of chunk {}, which holds {}",
                        slice.index,
                        slice.chunk_key,
                        tensors.len()
                    ))
                })?;
                let end = i64::from(slice.offset) + i64::from(slice.length);
                let shape = tensor.shape();
                let rows = shape.first().copied();
                if rows.is_none_or(|rows| end > rows) {
                    return Err(bad(format!(
                        "references rows {}..{end} of chunk {}, whose tensor {} has {} rows",
                        slice.offset,
                        slice.chunk_key,
                        slice.index,
                        rows.unwrap_or(0)
                    )));
                }
                match first {
                    None => first = Some(tensor),
                    Some(f) if f.dtype != tensor.dtype || f.shape()[1..] != shape[1..] => {
                        return Err(bad(format!(
                            "joins rows of {} {:?} and {} {:?} from chunk {}",
                            dtype_name(f.dtype),
                            &f.shape()[1..],
                            dtype_name(tensor.dtype),
                            &shape[1..],
                            slice.chunk_key
                        )));
                    }
                    Some(_) => {}
                }
                if !used.iter().any(|c| c.key() == slice.chunk_key) {
                    used.push(stored.clone());
                }
            }
        }
        Self::from_proto(item, used).map_err(|e| invalid(format!("Item {key} {e}")))
    }
}

/// What a client of this process reads of a sampled item in place.
impl StoredItem for ItemData {
    fn key(&self) -> u64 {
        self.key
    }

    fn columns(&self) -> usize {
        self.trajectory.columns()
    }

    fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    fn chunk(&self, position: usize) -> ChunkView<'_> {
        let chunk = &self.chunks[position];
        ChunkView {
            key: chunk.key,
            payload: chunk.payload.held(),
            delta_encoded: chunk.flags & DELTA_ENCODED != 0,
        }
    }

    fn prefetch(&self, level: usize) {
        match level {
            0 => {
                reverb_proto::prefetch(self.chunks.as_ptr());
                match &self.trajectory.0 {
                    Slices::One(_) => {}
                    Slices::Many(many) => reverb_proto::prefetch(many.as_ptr()),
                    Slices::Shifted(shared, _) => reverb_proto::prefetch(shared.as_ptr()),
                }
            }
            // (Every line of a record: a payload held in it runs past the first.)
            1 => self.chunks.iter().for_each(|c| {
                let record = Arc::as_ptr(c).cast::<u8>();
                let size = std::mem::size_of::<Chunk>();
                reverb_proto::prefetch(record);
                reverb_proto::prefetch(record.wrapping_add(size / 2));
                reverb_proto::prefetch(record.wrapping_add(size - 1));
            }),
            // (A payload held in its record was loaded with it.)
            _ => self
                .chunks
                .iter()
                .filter(|c| matches!(c.payload, Payload::Heap(_) | Payload::Lent(..)))
                .for_each(|c| reverb_proto::prefetch(c.payload.held().as_ptr())),
        }
    }

    fn for_each_slice(&self, f: &mut dyn FnMut(SliceView)) {
        self.trajectory.for_each_slice(&self.chunks, f)
    }

    fn to_wire(
        &self,
        table: &str,
        priority: f64,
        times_sampled: i32,
    ) -> (PrioritizedItem, Vec<ChunkData>) {
        let item = self.to_proto(table, priority, times_sampled);
        (item, self.chunks.iter().map(Chunk::data).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flat_trajectory::{ChunkSlice, Column};

    fn slice(chunk_key: u64, offset: i32, length: i32, index: i32) -> ChunkSlice {
        ChunkSlice {
            chunk_key,
            offset,
            length,
            index,
        }
    }

    fn chunks(keys: impl IntoIterator<Item = u64>) -> Vec<Arc<Chunk>> {
        keys.into_iter()
            .map(|chunk_key| {
                Arc::new(Chunk::new(ChunkData {
                    chunk_key,
                    ..Default::default()
                }))
            })
            .collect()
    }

    /// What a stored item and chunk cost beside their payload (each Arc adds 16 bytes, and
    /// the allocator rounds to 16 with 8 of its own): an item of one run allocates only its
    /// record and its chunk list.
    #[test]
    fn records_stay_small() {
        assert!(std::mem::size_of::<ItemData>() <= 56);
        // (With its inline payload: 120 bytes with the Arc's counts, 128 allocated.)
        assert!(std::mem::size_of::<Chunk>() <= 104);
        let run = FlatTrajectory {
            columns: vec![Column {
                chunk_slices: vec![slice(1, 1, 1, 0), slice(2, 0, 1, 0)],
                squeeze: false,
            }],
        };
        let chunks = vec![ranged(1, Some(2), false), ranged(2, Some(2), false)];
        let trajectory = Trajectory::new(&run, &chunks).unwrap();
        assert!(matches!(trajectory.0, Slices::One(_)));
        assert_eq!(trajectory.to_proto(&chunks), run);
    }

    #[test]
    fn the_compact_trajectory_gives_back_the_wire_form() {
        let cases = [
            (FlatTrajectory::default(), chunks([])),
            (
                FlatTrajectory {
                    columns: vec![
                        Column {
                            chunk_slices: vec![slice(7, 1, 2, 0), slice(8, 0, 3, 0)],
                            squeeze: false,
                        },
                        Column {
                            chunk_slices: vec![slice(9, 4, 1, 2)],
                            squeeze: true,
                        },
                        Column {
                            chunk_slices: vec![],
                            squeeze: true,
                        },
                        Column {
                            chunk_slices: vec![],
                            squeeze: false,
                        },
                        Column {
                            chunk_slices: vec![slice(u64::MAX, i32::MAX, -1, i32::MIN)],
                            squeeze: false,
                        },
                    ],
                },
                chunks([9, u64::MAX, 8, 7]),
            ),
            // Many chunks (looked up by key through a map).
            (
                FlatTrajectory {
                    columns: (0..40)
                        .map(|k| Column {
                            chunk_slices: vec![slice(1000 - k, 0, 1, 0)],
                            squeeze: k % 2 == 0,
                        })
                        .collect(),
                },
                chunks((0..40).map(|k| 961 + k)),
            ),
        ];
        for (trajectory, chunks) in cases {
            let compact = Trajectory::new(&trajectory, &chunks).unwrap();
            assert_eq!(compact.to_proto(&chunks), trajectory);
        }
    }

    /// A chunk of `key` whose range spans `rows` (dense), or sparse / without a range.
    fn ranged(key: u64, rows: Option<i32>, sparse: bool) -> Arc<Chunk> {
        Arc::new(Chunk::new(ChunkData {
            chunk_key: key,
            sequence_range: rows.map(|rows| SequenceRange {
                episode_id: 1,
                start: 10,
                end: 10 + rows - 1,
                sparse,
            }),
            ..Default::default()
        }))
    }

    #[test]
    fn a_column_through_consecutive_chunks_is_one_slice() {
        // A 10-step item of 2-step chunks, starting in the middle of its first chunk.
        let chunks: Vec<_> = (0..6).map(|k| ranged(k, Some(2), false)).collect();
        let mut slices = vec![slice(0, 1, 1, 0)];
        slices.extend((1..5).map(|k| slice(k, 0, 2, 0)));
        slices.push(slice(5, 0, 1, 0));
        let trajectory = FlatTrajectory {
            columns: vec![Column {
                chunk_slices: slices,
                squeeze: false,
            }],
        };
        let compact = Trajectory::new(&trajectory, &chunks).unwrap();
        assert_eq!(compact.slices().len(), 1);
        assert_eq!(compact.to_proto(&chunks), trajectory);
        // Not a run: a gap in a chunk, another tensor, a sparse chunk, a chunk without range.
        let broken = [
            (vec![slice(0, 0, 1, 0), slice(1, 0, 2, 0)], chunks.clone()),
            (vec![slice(0, 0, 2, 0), slice(1, 1, 1, 0)], chunks.clone()),
            (vec![slice(0, 0, 2, 0), slice(1, 0, 2, 1)], chunks.clone()),
            (vec![slice(0, 0, 2, 0), slice(2, 0, 2, 0)], chunks.clone()),
            (
                vec![slice(0, 0, 2, 0), slice(1, 0, 2, 0)],
                vec![ranged(0, Some(2), true), ranged(1, Some(2), false)],
            ),
            (
                vec![slice(0, 0, 2, 0), slice(1, 0, 2, 0)],
                vec![ranged(0, Some(2), false), ranged(1, None, false)],
            ),
        ];
        for (slices, chunks) in broken {
            let trajectory = FlatTrajectory {
                columns: vec![Column {
                    chunk_slices: slices,
                    squeeze: true,
                }],
            };
            let compact = Trajectory::new(&trajectory, &chunks).unwrap();
            assert_eq!(compact.slices().len(), 2, "{trajectory:?}");
            assert_eq!(compact.to_proto(&chunks), trajectory);
        }
    }

    proptest::proptest! {
        /// Any trajectory over chunks of any ranges comes back exactly as it went in.
        #[test]
        fn any_trajectory_round_trips(
            ranges in proptest::collection::vec(
                (proptest::option::of(0i32..4), proptest::bool::weighted(0.2)), 1..8),
            columns in proptest::collection::vec(
                (proptest::collection::vec((0usize..8, -1i32..4, -1i32..5, 0i32..2), 0..8),
                 proptest::bool::ANY),
                0..4),
        ) {
            let chunks: Vec<_> = ranges
                .iter()
                .enumerate()
                .map(|(k, &(rows, sparse))| ranged(k as u64, rows, sparse))
                .collect();
            let trajectory = FlatTrajectory {
                columns: columns
                    .into_iter()
                    .map(|(slices, squeeze)| Column {
                        chunk_slices: slices
                            .into_iter()
                            .map(|(k, offset, length, index)| {
                                slice((k % chunks.len()) as u64, offset, length, index)
                            })
                            .collect(),
                        squeeze,
                    })
                    .collect(),
            };
            let compact = Trajectory::new(&trajectory, &chunks).unwrap();
            proptest::prop_assert_eq!(compact.to_proto(&chunks), trajectory);
        }

        /// Columns as writers make them (consecutive steps across dense chunks) are one slice
        /// each, and come back exactly; so does such a column with one slice changed.
        #[test]
        fn writer_columns_are_runs(
            rows in proptest::collection::vec(1i32..5, 1..8),
            spans in proptest::collection::vec((0usize..8, 0i32..5, 1i32..20, 0i32..3), 1..4),
            change in proptest::option::of((0usize..8, -1i32..3, -1i32..3)),
        ) {
            let chunks: Vec<_> = rows
                .iter()
                .enumerate()
                .map(|(k, &rows)| ranged(k as u64, Some(rows), false))
                .collect();
            let mut columns = Vec::new();
            for &(first, offset, length, index) in &spans {
                let first = first % chunks.len();
                let mut offset = offset % rows[first];
                let (mut left, mut at) = (length, first);
                let mut slices = Vec::new();
                while left > 0 && at < chunks.len() {
                    let take = left.min(rows[at] - offset);
                    slices.push(slice(at as u64, offset, take, index));
                    left -= take;
                    offset = 0;
                    at += 1;
                }
                columns.push(Column { chunk_slices: slices, squeeze: false });
            }
            let trajectory = FlatTrajectory { columns };
            let compact = Trajectory::new(&trajectory, &chunks).unwrap();
            proptest::prop_assert_eq!(compact.slices().len(), spans.len());
            proptest::prop_assert_eq!(compact.to_proto(&chunks), trajectory.clone());
            if let Some((which, d_offset, d_length)) = change {
                let mut changed = trajectory;
                let column = &mut changed.columns[which % spans.len()];
                let n = column.chunk_slices.len();
                let s = &mut column.chunk_slices[which % n];
                s.offset += d_offset;
                s.length += d_length;
                let compact = Trajectory::new(&changed, &chunks).unwrap();
                proptest::prop_assert_eq!(compact.to_proto(&chunks), changed);
            }
        }
    }

    #[test]
    fn a_stored_chunk_gives_back_its_wire_form_without_transport_fields() {
        let ranges = [
            None,
            Some(SequenceRange {
                episode_id: u64::MAX,
                start: i32::MIN,
                end: i32::MAX,
                sparse: true,
            }),
            Some(SequenceRange {
                episode_id: 7,
                start: 3,
                end: 4,
                sparse: false,
            }),
        ];
        for (i, range) in ranges.into_iter().enumerate() {
            let data = ChunkData {
                chunk_key: 11 + i as u64,
                sequence_range: range,
                data: Bytes::from(vec![i as u8; 5 + i]),
                data_tensors_len: 2 + i as i32,
                data_uncompressed_size: 1 << 40,
                delta_encoded: i == 1,
                shm_position: 5,
                shm_length: 10,
            };
            let chunk = Arc::new(Chunk::new(data.clone()));
            let back = chunk.data();
            assert_eq!((back.shm_position, back.shm_length), (0, 0));
            assert_eq!(
                back,
                ChunkData {
                    shm_position: 0,
                    shm_length: 0,
                    ..data
                }
            );
            assert_eq!(chunk.episode_id(), range.map_or(0, |r| r.episode_id));
            // The wire form outlives the chunk it came from.
            drop(chunk);
            assert_eq!(&back.data[..], &vec![i as u8; 5 + i][..]);
        }
    }

    #[test]
    fn insertion_times_round_trip() {
        let mut item = ItemData::new(1, &FlatTrajectory::default(), vec![]).unwrap();
        assert_eq!(item.inserted_at(), None);
        for (seconds, nanos) in [(1_764_748_800, 123_456_789), (-5, 7), (0, 1), (12, 0)] {
            let at = prost_types::Timestamp { seconds, nanos };
            item.set_inserted_at(&at);
            assert_eq!(item.inserted_at(), Some(at));
        }
        // The epoch itself is kept as one nanosecond after it (0 means "not set").
        item.set_inserted_at(&prost_types::Timestamp::default());
        assert_eq!(
            item.inserted_at().map(|t| (t.seconds, t.nanos)),
            Some((0, 1))
        );
    }

    #[test]
    fn a_slice_of_a_chunk_the_item_does_not_hold_is_an_error() {
        let trajectory = FlatTrajectory {
            columns: vec![Column {
                chunk_slices: vec![slice(5, 0, 1, 0)],
                squeeze: false,
            }],
        };
        let error = Trajectory::new(&trajectory, &chunks([4])).unwrap_err();
        assert!(error.contains("chunk 5"), "{error}");
    }
}
