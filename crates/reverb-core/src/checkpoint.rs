//! The checkpoint file format: a magic header, then length-prefixed, CRC-checked records
//! (tables, deduplicated chunks, items in insertion order), then an end record with counts.
//! A file that is truncated, has a bad CRC or lacks the end record is rejected as a whole.
//!
//! Record: `kind: u8 | len: u32 LE | crc32(payload): u32 LE | payload`.
//!
//! A chunk whose payload a chunk store holds on disk (a server's `storage`) is not copied:
//! its record (`LINKED`) says where the payload is in the store's segment log, whose segment
//! is hard-linked into the checkpoint directory's `segments/` (the store goes on appending,
//! compacting and unlinking; the linked file keeps what the checkpoint references). Where
//! links cannot be made (the checkpoint on another filesystem) the payload is copied.

use crate::chunk::{ItemError, STORED_HEADER};
use crate::segment_log::{read_record, segment_name, Place};
use crate::selectors::SelectorKind;
use crate::{invalid_arg, Chunk, ChunkStore, CoreError, ItemData, Result, Table, TableSnapshot};
use bytes::Bytes;
use prost::Message;
use reverb_proto::payload::{chunk_layouts, Layouts};
use reverb_proto::{ChunkData, PrioritizedItem, PriorityTableCheckpoint, RateLimiterCheckpoint};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// First bytes of every checkpoint file.
pub const MAGIC: &[u8; 8] = b"RVBCKPT1";
/// The checkpoint file's name in its directory.
pub const FILE_NAME: &str = "checkpoint.rvb";
/// The subdirectory of a checkpoint holding the segments its linked chunks are in.
pub const SEGMENTS: &str = "segments";
const TABLE: u8 = 1;
const CHUNK: u8 = 2;
const ITEM: u8 = 3;
/// A chunk whose payload is in a linked segment: `segment: u64 LE | at: u64 LE | len: u32
/// LE` (the segment log's record), then the chunk's encoding without its data.
const LINKED: u8 = 4;
const END: u8 = 9;

fn record(out: &mut impl Write, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    record_parts(out, kind, &[payload])
}

/// One record whose payload is the concatenation of `parts` (no copy to join them).
fn record_parts(out: &mut impl Write, kind: u8, parts: &[&[u8]]) -> std::io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let len = u32::try_from(total)
        .map_err(|_| std::io::Error::other("checkpoint record larger than 4 GiB"))?;
    let mut crc = crc32fast::Hasher::new();
    parts.iter().for_each(|p| crc.update(p));
    out.write_all(&[kind])?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(&crc.finalize().to_le_bytes())?;
    for part in parts {
        out.write_all(part)?;
    }
    Ok(())
}

/// A chunk's encoding, split so its payload bytes are written straight from memory: every
/// field but `data`, then the `data` field's tag and length, then the payload.
fn chunk_parts(chunk: &ChunkData, head: &mut Vec<u8>) {
    head.clear();
    let meta = ChunkData {
        data: Bytes::new(),
        ..chunk.clone()
    };
    meta.encode(head).expect("vec has room");
    if !chunk.data.is_empty() {
        // Field 5, wire type 2 (length-delimited), then the varint length.
        prost::encoding::encode_key(5, prost::encoding::WireType::LengthDelimited, head);
        prost::encoding::encode_varint(chunk.data.len() as u64, head);
    }
}

/// What a checkpoint of one table holds.
pub struct SavedTable {
    /// Settings and counters as saved.
    pub header: PriorityTableCheckpoint,
    /// Contents.
    pub snapshot: TableSnapshot,
}

/// Chunks on disk referenced where they are: their store's segments hard-linked into a
/// checkpoint's `segments/` (one store's: a server has one; other stores' chunks are copied).
struct Links {
    dir: PathBuf,
    store: Option<Arc<ChunkStore>>,
    linked: HashSet<u64>,
    /// Set once linking failed (another filesystem): payloads are copied from then on.
    failed: bool,
}

impl Links {
    fn new(checkpoint_dir: &Path) -> Self {
        Self {
            dir: checkpoint_dir.join(SEGMENTS),
            store: None,
            linked: HashSet::new(),
            failed: false,
        }
    }

    /// Where `chunk`'s record is in a linked segment; None when it is to be copied.
    fn place(&mut self, chunk: &Chunk) -> Option<Place> {
        let store = chunk.store()?;
        if self.failed {
            return None;
        }
        match &self.store {
            None => {
                if std::fs::create_dir_all(&self.dir).is_err() {
                    self.failed = true;
                    return None;
                }
                self.store = Some(store.clone());
            }
            Some(ours) if !Arc::ptr_eq(ours, store) => return None,
            Some(_) => {}
        }
        store
            .link(chunk.key(), &self.dir, &mut self.linked)
            .unwrap_or_else(|_| {
                self.failed = true;
                None
            })
    }

    /// Makes the links durable (the segments they name were synced when sealed).
    fn sync(&self) -> std::io::Result<()> {
        if self.store.is_some() {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// Writes snapshots of `tables` (each chunk once, even when shared across tables). With the
/// checkpoint's directory `dir`, chunks stored on disk are linked, not copied (see the
/// module's documentation). Returns bytes written.
pub fn write(
    out: &mut impl Write,
    tables: &[(&Table, &TableSnapshot)],
    dir: Option<&Path>,
) -> std::io::Result<u64> {
    let mut counting = Counting {
        inner: out,
        bytes: 0,
    };
    let out = &mut counting;
    out.write_all(MAGIC)?;
    let (mut n_chunks, mut n_items) = (0u64, 0u64);
    for (table, snapshot) in tables {
        let config = table.config();
        let (inserts, samples, deletes) = snapshot.counters;
        let header = PriorityTableCheckpoint {
            table_name: config.name.clone(),
            max_size: config.max_size,
            max_times_sampled: config.max_times_sampled,
            deprecated_items: Vec::new(),
            rate_limiter: Some(RateLimiterCheckpoint {
                samples_per_insert: config.rate_limiter.samples_per_insert,
                min_diff: config.rate_limiter.min_diff,
                max_diff: config.rate_limiter.max_diff,
                min_size_to_sample: config.rate_limiter.min_size_to_sample,
                sample_count: samples,
                insert_count: inserts,
                delete_count: deletes,
            }),
            sampler: Some(config.sampler.options()),
            remover: Some(config.remover.options()),
            num_deleted_episodes: snapshot.num_deleted_episodes,
            signature: config.signature.clone().unwrap_or_default(),
            num_unique_samples: snapshot.num_unique_samples,
        };
        record(out, TABLE, &header.encode_to_vec())?;
    }
    let mut written: HashSet<u64> = HashSet::new();
    let mut links = dir.map(Links::new);
    let mut buf = Vec::new();
    for (_, snapshot) in tables {
        for (item, _, _) in &snapshot.items {
            for chunk in item.chunks() {
                if !written.insert(chunk.key()) {
                    continue;
                }
                n_chunks += 1;
                if let Some(place) = links.as_mut().and_then(|l| l.place(chunk)) {
                    buf.clear();
                    buf.extend_from_slice(&place.segment.to_le_bytes());
                    buf.extend_from_slice(&place.at.to_le_bytes());
                    buf.extend_from_slice(&place.len.to_le_bytes());
                    chunk.data().encode(&mut buf).expect("vec has room");
                    record(out, LINKED, &buf)?;
                } else {
                    // (Read back past the cache if it is on disk: the checkpoint holds it.)
                    let chunk = chunk.read_once()?;
                    chunk_parts(&chunk.data(), &mut buf);
                    record_parts(out, CHUNK, &[&buf, chunk.payload()])?;
                }
            }
        }
    }
    if let Some(links) = &links {
        links.sync()?;
    }
    for (table, snapshot) in tables {
        for (item, priority, times_sampled) in &snapshot.items {
            let proto = item.to_proto(table.name(), *priority, *times_sampled);
            buf.clear();
            proto.encode(&mut buf).expect("vec has room");
            record(out, ITEM, &buf)?;
            n_items += 1;
        }
    }
    let mut end = Vec::with_capacity(24);
    for n in [tables.len() as u64, n_chunks, n_items] {
        end.extend_from_slice(&n.to_le_bytes());
    }
    record(out, END, &end)?;
    Ok(counting.bytes)
}

/// Writes a checkpoint record by record from encoded messages (tables first, then chunks,
/// then items): how another format (dm-reverb's) is turned into ours, one record at a time.
/// The file is checked when [`Reader::open`] reads it.
pub struct RecordWriter<W: Write> {
    out: W,
    /// Tables, chunks and items written.
    counts: [u64; 3],
}

impl<W: Write> RecordWriter<W> {
    /// Starts a checkpoint on `out`.
    pub fn new(mut out: W) -> std::io::Result<Self> {
        out.write_all(MAGIC)?;
        Ok(Self {
            out,
            counts: [0; 3],
        })
    }
    /// An encoded `PriorityTableCheckpoint`.
    pub fn table(&mut self, encoded: &[u8]) -> std::io::Result<()> {
        self.counts[0] += 1;
        record(&mut self.out, TABLE, encoded)
    }
    /// An encoded `ChunkData`.
    pub fn chunk(&mut self, encoded: &[u8]) -> std::io::Result<()> {
        self.counts[1] += 1;
        record(&mut self.out, CHUNK, encoded)
    }
    /// An encoded `PrioritizedItem`.
    pub fn item(&mut self, encoded: &[u8]) -> std::io::Result<()> {
        self.counts[2] += 1;
        record(&mut self.out, ITEM, encoded)
    }
    /// Ends the checkpoint (its end record, with the counts) and flushes it.
    pub fn finish(mut self) -> std::io::Result<W> {
        let mut end = Vec::with_capacity(24);
        for n in self.counts {
            end.extend_from_slice(&n.to_le_bytes());
        }
        record(&mut self.out, END, &end)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

struct Counting<'a, W: Write> {
    inner: &'a mut W,
    bytes: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The error for a checkpoint that cannot be loaded as it is.
pub fn corrupt(what: impl std::fmt::Display) -> CoreError {
    CoreError::FailedPrecondition(format!("corrupt checkpoint: {what}"))
}

/// Builds saved tables from decoded checkpoint records: tables first, then chunks, then items
/// (in insertion order per table). Both checkpoint formats (ours and dm-reverb's TFRecord
/// files) feed it, so restored items are checked the same way.
#[derive(Default)]
pub struct Assembler {
    tables: BTreeMap<String, SavedTable>,
    // Each chunk with its tensors' layouts, which items are checked against.
    chunks: HashMap<u64, (Arc<Chunk>, Layouts)>,
    items: u64,
    store: Option<Arc<ChunkStore>>,
}

impl Assembler {
    /// An assembler whose chunks' payloads go to `store` as they come, when given (a server
    /// storing chunks on disk restores into it: one payload at a time is in memory).
    pub fn storing(store: Option<Arc<ChunkStore>>) -> Self {
        Self {
            store,
            ..Self::default()
        }
    }

    /// Adds a table's settings and counters.
    pub fn table(&mut self, header: PriorityTableCheckpoint) {
        let snapshot = TableSnapshot {
            items: Vec::new(),
            counters: header.rate_limiter.as_ref().map_or((0, 0, 0), |r| {
                (r.insert_count, r.sample_count, r.delete_count)
            }),
            num_deleted_episodes: header.num_deleted_episodes,
            num_unique_samples: header.num_unique_samples,
        };
        self.tables
            .insert(header.table_name.clone(), SavedTable { header, snapshot });
    }

    /// Adds a chunk (items that follow may reference it).
    pub fn chunk(&mut self, chunk: ChunkData) -> Result<()> {
        let key = chunk.chunk_key;
        let layouts =
            chunk_layouts(&chunk).map_err(|e| corrupt(format!("chunk {key}: {}", e.message)))?;
        let chunk = match &self.store {
            Some(store) => store
                .store(chunk)
                .map_err(|e| CoreError::FailedPrecondition(e.to_string()))?,
            None => Arc::new(Chunk::new(chunk)),
        };
        self.chunks.insert(key, (chunk, layouts));
        Ok(())
    }

    /// Adds an item to the end of its table, checked against its chunks as an inserted item is:
    /// a restored table serves what it holds.
    pub fn item(&mut self, item: &PrioritizedItem) -> Result<()> {
        let key = item.key;
        let chunks = &self.chunks;
        let data =
            ItemData::checked(item, |k| chunks.get(&k).map(|(c, l)| (c, &l[..]))).map_err(|e| {
                match e {
                    ItemError::MissingChunk(chunk) => {
                        corrupt(format!("item {key} references missing chunk {chunk}"))
                    }
                    ItemError::Invalid(what) => corrupt(what),
                }
            })?;
        let saved = self
            .tables
            .get_mut(&item.table)
            .ok_or_else(|| corrupt(format!("item {key} of unknown table {}", item.table)))?;
        saved
            .snapshot
            .items
            .push((Arc::new(data), item.priority, item.times_sampled));
        self.items += 1;
        Ok(())
    }

    /// Numbers of tables, chunks and items added.
    pub fn counts(&self) -> [u64; 3] {
        [
            self.tables.len() as u64,
            self.chunks.len() as u64,
            self.items,
        ]
    }

    /// The saved tables.
    pub fn finish(self) -> BTreeMap<String, SavedTable> {
        self.tables
    }
}

/// The segments a checkpoint's linked chunks are in (its `segments/`), opened as needed.
struct LinkedSegments {
    dir: Option<PathBuf>,
    open: HashMap<u64, File>,
}

impl LinkedSegments {
    /// Open segment files kept at most (a checkpoint of a large table links many).
    const MAX_OPEN: usize = 64;

    /// The linked segments of the checkpoint in `checkpoint_dir` (None: none can be read).
    fn new(checkpoint_dir: Option<&Path>) -> Self {
        Self {
            dir: checkpoint_dir.map(|d| d.join(SEGMENTS)),
            open: HashMap::new(),
        }
    }

    /// A `LINKED` record's place and chunk fields.
    fn parse(payload: &[u8]) -> Result<(Place, ChunkData)> {
        if payload.len() < 20 {
            return Err(corrupt("a linked chunk's record is too short"));
        }
        let u64_at = |i: usize| u64::from_le_bytes(payload[i..i + 8].try_into().expect("8"));
        let place = Place {
            segment: u64_at(0),
            at: u64_at(8),
            len: u32::from_le_bytes(payload[16..20].try_into().expect("4 bytes")),
        };
        Ok((place, ChunkData::decode(&payload[20..]).map_err(corrupt)?))
    }

    /// The chunk a `LINKED` record names, its payload read from its segment and checked.
    fn chunk(&mut self, payload: &[u8]) -> Result<ChunkData> {
        let (place, fields) = Self::parse(payload)?;
        let key = fields.chunk_key;
        let Some(dir) = &self.dir else {
            return Err(corrupt(format!(
                "chunk {key} is in a linked segment, and the checkpoint's directory is unknown"
            )));
        };
        let path = dir.join(segment_name(place.segment));
        if !self.open.contains_key(&place.segment) {
            let file = File::open(&path).map_err(|e| {
                corrupt(format!(
                    "chunk {key} is in {}, which cannot be opened: {e}",
                    path.display()
                ))
            })?;
            if self.open.len() >= Self::MAX_OPEN {
                self.open.clear();
            }
            self.open.insert(place.segment, file);
        }
        let mut header = [0u8; STORED_HEADER];
        let file = &self.open[&place.segment];
        let payload = read_record(file, &path, key, place, &mut header, |len| vec![0u8; len])
            .map_err(|e| corrupt(e.to_string()))?;
        if header != Chunk::header_of(&fields) {
            return Err(corrupt(format!(
                "chunk {key} in {} is not the chunk the checkpoint names",
                path.display()
            )));
        }
        Ok(ChunkData {
            data: payload.into(),
            ..fields
        })
    }
}

/// Reads a whole checkpoint, verifying every record. Chunks are shared between the items (and
/// tables) that reference them. `dir` is the checkpoint's directory (where its linked
/// segments are); with `store`, chunks' payloads go to it as they are read.
pub fn read(
    input: &mut impl Read,
    dir: Option<&Path>,
    store: Option<&Arc<ChunkStore>>,
) -> Result<BTreeMap<String, SavedTable>> {
    check_magic(input)?;
    let mut saved = Assembler::storing(store.cloned());
    let mut segments = LinkedSegments::new(dir);
    let mut payload = Vec::new();
    loop {
        let Some(kind) = next_record(input, &mut payload)? else {
            return Err(corrupt("truncated (no end record)"));
        };
        let payload = Bytes::from(std::mem::take(&mut payload));
        match kind {
            TABLE => saved.table(PriorityTableCheckpoint::decode(payload).map_err(corrupt)?),
            CHUNK => saved.chunk(ChunkData::decode(payload).map_err(corrupt)?)?,
            LINKED => saved.chunk(segments.chunk(&payload)?)?,
            ITEM => saved.item(&PrioritizedItem::decode(payload).map_err(corrupt)?)?,
            END => {
                if end_counts(&payload) != Some(saved.counts()) {
                    return Err(corrupt("record counts do not match the end record"));
                }
                return Ok(saved.finish());
            }
            other => return Err(corrupt(format!("unknown record kind {other}"))),
        }
    }
}

/// Reads the file's first bytes: our magic, or the file is refused.
fn check_magic(input: &mut impl Read) -> Result<()> {
    let mut magic = [0u8; 8];
    input
        .read_exact(&mut magic)
        .map_err(|_| corrupt("file too short for its header"))?;
    if &magic != MAGIC {
        return Err(corrupt("not a reverb checkpoint (bad magic bytes)"));
    }
    Ok(())
}

/// Reads the record at the input's position: its kind, with its payload in `payload`,
/// checked against its CRC. `None` at the end of the input.
fn next_record(input: &mut impl Read, payload: &mut Vec<u8>) -> Result<Option<u8>> {
    let mut head = [0u8; 9];
    match input.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(corrupt(format!("cannot read: {e}"))),
    }
    let len = u32::from_le_bytes(head[1..5].try_into().unwrap()) as u64;
    let crc = u32::from_le_bytes(head[5..9].try_into().unwrap());
    payload.clear();
    // (Reserved up to 64 MiB and read through `take`: a corrupt length never allocates much
    // more than the input holds.)
    payload.reserve(len.min(64 << 20) as usize);
    let read = input
        .take(len)
        .read_to_end(payload)
        .map_err(|e| corrupt(format!("cannot read: {e}")))?;
    if read as u64 != len {
        return Err(corrupt("truncated record"));
    }
    if crc32fast::hash(payload) != crc {
        return Err(corrupt("a record fails its checksum"));
    }
    if payload.capacity() > payload.len() + (1 << 20) {
        payload.shrink_to_fit(); // (past the reservation, `read_to_end` grew it by doubling)
    }
    Ok(Some(head[0]))
}

/// The three counts of an end record's payload (tables, chunks, items).
fn end_counts(payload: &[u8]) -> Option<[u64; 3]> {
    if payload.len() != 24 {
        return None;
    }
    let count = |i: usize| u64::from_le_bytes(payload[i * 8..i * 8 + 8].try_into().unwrap());
    Some([count(0), count(1), count(2)])
}

/// A checkpoint file read in place, without a server, in bounded memory (the offline
/// reader, `reverb.checkpoint.open`). Opening reads the file once, checking every record and
/// the end record's counts, and keeps the tables' headers, where each chunk is (about 20
/// bytes a chunk) and where each table's items are (runs of consecutive records); items are
/// then read in insertion order and chunks fetched from the file by key when asked for.
pub struct Reader<F> {
    file: F,
    segments: LinkedSegments,
    /// Where `file` is (so reads in sequence do not seek: a seek empties a `BufReader`).
    position: u64,
    tables: Vec<PriorityTableCheckpoint>,
    chunks: HashMap<u64, ChunkAt>,
    runs: Vec<ItemRun>,
}

/// Where a chunk record's payload is, and the episode and step of the chunk's first row
/// (kept from the opening read, so items' metadata needs no chunk read).
struct ChunkAt {
    offset: u64,
    len: u32,
    origin: Option<(u64, i32)>,
}

/// Consecutive item records of one table: where the first starts, and how many there are.
struct ItemRun {
    table: String,
    offset: u64,
    count: u64,
}

/// Where a walk over one table's items stands (see [`Reader::next_item`]).
#[derive(Debug, Clone)]
pub struct ItemCursor {
    table: String,
    run: usize,
    offset: u64,
    left: u64,
}

impl<F: Read + Seek> Reader<F> {
    /// Reads the whole file once to check and index it; a file that is not a checkpoint, is
    /// truncated, fails a checksum or lacks its end record is refused.
    pub fn open(mut file: F) -> Result<Self> {
        let io = |e: std::io::Error| corrupt(format!("cannot read: {e}"));
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        let mut input = std::io::BufReader::with_capacity(1 << 20, &mut file);
        check_magic(&mut input)?;
        let mut tables: Vec<PriorityTableCheckpoint> = Vec::new();
        let mut chunks = HashMap::new();
        let mut runs: Vec<ItemRun> = Vec::new();
        let (mut offset, mut items, mut previous_was_item) = (MAGIC.len() as u64, 0u64, false);
        let mut payload = Vec::new();
        loop {
            let Some(kind) = next_record(&mut input, &mut payload)? else {
                return Err(corrupt("truncated (no end record)"));
            };
            let start = offset;
            offset += 9 + payload.len() as u64;
            let is_item = kind == ITEM;
            match kind {
                TABLE => {
                    tables.push(PriorityTableCheckpoint::decode(&payload[..]).map_err(corrupt)?)
                }
                CHUNK | LINKED => {
                    let chunk = match kind {
                        CHUNK => ChunkData::decode(&payload[..]).map_err(corrupt)?,
                        _ => LinkedSegments::parse(&payload)?.1,
                    };
                    let at = ChunkAt {
                        offset: start + 9,
                        len: payload.len() as u32,
                        origin: chunk.sequence_range.map(|r| (r.episode_id, r.start)),
                    };
                    chunks.insert(chunk.chunk_key, at);
                }
                ITEM => {
                    let item = PrioritizedItem::decode(&payload[..]).map_err(corrupt)?;
                    if !tables.iter().any(|t| t.table_name == item.table) {
                        return Err(corrupt(format!(
                            "item {} of unknown table {}",
                            item.key, item.table
                        )));
                    }
                    items += 1;
                    match runs.last_mut() {
                        Some(run) if previous_was_item && run.table == item.table => run.count += 1,
                        _ => runs.push(ItemRun {
                            table: item.table,
                            offset: start,
                            count: 1,
                        }),
                    }
                }
                END => {
                    let counts = [tables.len() as u64, chunks.len() as u64, items];
                    if end_counts(&payload) != Some(counts) {
                        return Err(corrupt("record counts do not match the end record"));
                    }
                    drop(input);
                    let position = file.stream_position().map_err(io)?;
                    return Ok(Self {
                        file,
                        segments: LinkedSegments::new(None),
                        position,
                        tables,
                        chunks,
                        runs,
                    });
                }
                other => return Err(corrupt(format!("unknown record kind {other}"))),
            }
            previous_was_item = is_item;
        }
    }

    /// Chunks linked (not copied) into the checkpoint are read from `dir`'s `segments/`
    /// (`dir`: the checkpoint's directory, where its file is).
    pub fn linked_in(mut self, dir: &Path) -> Self {
        self.segments = LinkedSegments::new(Some(dir));
        self
    }

    /// The episode and step of chunk `key`'s first row (None without a sequence range);
    /// an error for a chunk the file lacks. Reads nothing.
    pub fn chunk_origin(&self, key: u64) -> Result<Option<(u64, i32)>> {
        let at = self.chunks.get(&key);
        let at = at.ok_or_else(|| corrupt(format!("an item references missing chunk {key}")))?;
        Ok(at.origin)
    }

    /// The tables' settings and counters, in the file's order.
    pub fn tables(&self) -> &[PriorityTableCheckpoint] {
        &self.tables
    }

    /// How many items `table` holds.
    pub fn item_count(&self, table: &str) -> u64 {
        self.runs
            .iter()
            .filter(|r| r.table == table)
            .map(|r| r.count)
            .sum()
    }

    /// A cursor at the first item of `table` (at the end when it has none).
    pub fn cursor(&self, table: &str) -> ItemCursor {
        let mut cursor = ItemCursor {
            table: table.to_string(),
            run: 0,
            offset: 0,
            left: 0,
        };
        self.seek_run(&mut cursor, 0);
        cursor
    }

    fn seek_run(&self, cursor: &mut ItemCursor, from: usize) {
        cursor.run = (from..self.runs.len())
            .find(|&i| self.runs[i].table == cursor.table)
            .unwrap_or(self.runs.len());
        if let Some(run) = self.runs.get(cursor.run) {
            (cursor.offset, cursor.left) = (run.offset, run.count);
        } else {
            cursor.left = 0;
        }
    }

    /// The item at `cursor` (then moves it on); `None` after the table's last item.
    pub fn next_item(&mut self, cursor: &mut ItemCursor) -> Result<Option<PrioritizedItem>> {
        if cursor.left == 0 {
            if cursor.run >= self.runs.len() {
                return Ok(None);
            }
            self.seek_run(cursor, cursor.run + 1);
            if cursor.left == 0 {
                return Ok(None);
            }
        }
        let mut payload = Vec::new();
        let kind = self.record_at(cursor.offset, &mut payload)?;
        if kind != Some(ITEM) {
            return Err(corrupt("the file changed since it was opened"));
        }
        cursor.offset += 9 + payload.len() as u64;
        cursor.left -= 1;
        PrioritizedItem::decode(&payload[..])
            .map(Some)
            .map_err(corrupt)
    }

    /// The record at `offset` (see [`next_record`]).
    fn record_at(&mut self, offset: u64, payload: &mut Vec<u8>) -> Result<Option<u8>> {
        if self.position != offset {
            let io = |e: std::io::Error| corrupt(format!("cannot read: {e}"));
            self.file.seek(SeekFrom::Start(offset)).map_err(io)?;
            self.position = offset;
        }
        // (On an error the position is unknown: the next read seeks.)
        self.position = u64::MAX;
        let kind = next_record(&mut self.file, payload)?;
        if kind.is_some() {
            self.position = offset + 9 + payload.len() as u64;
        }
        Ok(kind)
    }

    /// The chunk `key` (its record checked again as it is read).
    pub fn chunk(&mut self, key: u64) -> Result<ChunkData> {
        let &ChunkAt { offset, len, .. } = self
            .chunks
            .get(&key)
            .ok_or_else(|| corrupt(format!("an item references missing chunk {key}")))?;
        let mut payload = Vec::with_capacity(len as usize);
        match self.record_at(offset - 9, &mut payload)? {
            Some(CHUNK) => ChunkData::decode(Bytes::from(payload)).map_err(corrupt),
            Some(LINKED) => self.segments.chunk(&payload),
            _ => Err(corrupt("the file changed since it was opened")),
        }
    }
}

/// Loads saved tables into the configured ones. Every configured table must be in the
/// checkpoint and vice versa (names must match). The configured settings (selectors, max
/// size, rate limiter bounds, max_times_sampled) win; contents and counters come from the
/// checkpoint. Everything is checked before any table changes.
pub fn restore(
    tables: &[Arc<Table>],
    mut saved: BTreeMap<String, SavedTable>,
) -> Result<Vec<usize>> {
    let configured: Vec<&str> = tables.iter().map(|t| t.name()).collect();
    let in_checkpoint: Vec<String> = saved.keys().cloned().collect();
    if configured.len() != in_checkpoint.len() || configured.iter().any(|n| !saved.contains_key(*n))
    {
        return Err(invalid_arg!(
            "The checkpoint holds tables {in_checkpoint:?} but the server is configured with {configured:?}; \
             the names must match"
        ));
    }
    for table in tables {
        let header = &saved[table.name()].header;
        for selector in [&header.sampler, &header.remover].into_iter().flatten() {
            SelectorKind::from_options(selector)?;
        }
        table.check_snapshot(&saved[table.name()].snapshot)?;
    }
    tables
        .iter()
        .map(|t| t.restore(saved.remove(t.name()).expect("checked").snapshot))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{InsertOutcome, RateLimiterConfig, TableConfig};
    use reverb_proto::{flat_trajectory, FlatTrajectory, SequenceRange};

    fn table(name: &str, sampler: SelectorKind, max_size: i64) -> Arc<Table> {
        Arc::new(
            Table::new(TableConfig {
                name: name.into(),
                sampler,
                remover: SelectorKind::Fifo,
                max_size,
                max_times_sampled: 0,
                rate_limiter: RateLimiterConfig {
                    samples_per_insert: 2.0,
                    min_size_to_sample: 1,
                    min_diff: -10.0,
                    max_diff: 10.0,
                },
                signature: Some(Bytes::from_static(b"sig")),
            })
            .unwrap(),
        )
    }

    /// The snappy data of a chunk's tensor: 100 bytes naming `key`, stored as one literal.
    fn content(key: u64) -> Vec<u8> {
        let mut out = vec![100, 60 << 2, 99];
        out.extend((0..100u64).map(|i| (key * 31 + i * 17) as u8));
        out
    }

    /// A chunk of one uint8 tensor of one row of 100 bytes.
    fn payload(key: u64, rows: i64) -> Bytes {
        use reverb_proto::tensorflow::{TensorProto, TensorShapeProto};
        let tensor = TensorProto {
            dtype: 4,
            tensor_shape: Some(TensorShapeProto::of(&[rows, 100 / rows])),
            tensor_content: content(key).into(),
            ..Default::default()
        };
        reverb_proto::ChunkTensors {
            tensors: vec![tensor],
        }
        .encode_to_vec()
        .into()
    }

    fn chunk(key: u64) -> Arc<Chunk> {
        Arc::new(Chunk::new(ChunkData {
            chunk_key: key,
            sequence_range: Some(SequenceRange {
                episode_id: key % 3,
                start: 0,
                end: 0,
                sparse: false,
            }),
            data: payload(key, 1),
            data_tensors_len: 1,
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

    fn filled() -> (Arc<Table>, Arc<Table>, Vec<u8>) {
        let a = table("a", SelectorKind::Fifo, 10);
        let b = table("b", SelectorKind::MaxHeap, 10);
        let shared = chunk(7);
        for k in 1..=4u64 {
            let chunks = vec![shared.clone(), chunk(100 + k)];
            assert!(matches!(
                a.try_insert(item(k, chunks.clone()), k as f64).unwrap(),
                InsertOutcome::Inserted
            ));
            b.try_insert(item(10 + k, chunks), 5.0 - k as f64).unwrap();
        }
        a.try_sample(3, usize::MAX);
        let snaps = [a.snapshot(), b.snapshot()];
        let mut out = Vec::new();
        write(&mut out, &[(&a, &snaps[0]), (&b, &snaps[1])], None).unwrap();
        (a, b, out)
    }

    #[test]
    fn round_trip_shares_chunks_and_keeps_order_and_counters() {
        let (a, b, bytes) = filled();
        // The shared chunk is written once: its bytes appear in one record only.
        let seven = content(7);
        let sevens = bytes.windows(seven.len()).filter(|w| *w == seven).count();
        assert_eq!(sevens, 1);
        let saved = read(&mut bytes.as_slice(), None, None).unwrap();
        assert_eq!(saved.len(), 2);
        let a2 = table("a", SelectorKind::Fifo, 10);
        let b2 = table("b", SelectorKind::MaxHeap, 10);
        restore(&[a2.clone(), b2.clone()], saved).unwrap();
        assert_eq!(a2.info(), a.info());
        let keys = |t: &Table| {
            t.snapshot()
                .items
                .iter()
                .map(|i| (i.0.key, i.1, i.2))
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&a2), keys(&a));
        assert_eq!(keys(&b2), keys(&b));
        // Restored items share one chunk object, across tables too.
        let s1 = a2.snapshot();
        let s2 = b2.snapshot();
        assert!(Arc::ptr_eq(
            &s1.items[0].0.chunks()[0],
            &s2.items[3].0.chunks()[0]
        ));
        // Deterministic selectors continue where they were.
        assert_eq!(b2.try_sample(1, usize::MAX)[0].item.key, 11);
        assert_eq!(a2.can_sample(1), a.can_sample(1));
        assert_eq!(a2.can_insert(1), a.can_insert(1));
    }

    /// Records that pass their checksums but hold an item its chunks cannot serve (written
    /// by another program, or a bug) are refused when read, saying what is wrong.
    #[test]
    fn items_that_do_not_fit_their_chunks_are_refused() {
        // (Uniform: a table that keeps its items' rows looks at the slice too.)
        for sampler in [SelectorKind::Fifo, SelectorKind::Uniform] {
            for (offset, length, what) in [
                (
                    0,
                    5,
                    "references rows 0..5 of chunk 9, whose tensor 0 has 1 rows",
                ),
                (
                    -1,
                    1,
                    "has an invalid chunk slice (offset -1, length 1, index 0)",
                ),
            ] {
                let t = table("a", sampler, 10);
                let trajectory = FlatTrajectory {
                    columns: vec![flat_trajectory::Column {
                        chunk_slices: vec![flat_trajectory::ChunkSlice {
                            chunk_key: 9,
                            offset,
                            length,
                            index: 0,
                        }],
                        squeeze: false,
                    }],
                };
                let data = ItemData::new(3, &trajectory, vec![chunk(9)]).unwrap();
                t.try_insert(data, 1.0).unwrap();
                let mut out = Vec::new();
                write(&mut out, &[(&t, &t.snapshot())], None).unwrap();
                let Err(e) = read(&mut out.as_slice(), None, None) else {
                    panic!(
                        "read an item that slices {offset}..{} of a 1-row chunk",
                        offset + length
                    );
                };
                let e = e.to_string();
                assert!(e.contains("corrupt checkpoint: Column 0 of item 3"), "{e}");
                assert!(e.contains(what), "{e}");
            }
        }
    }

    #[test]
    fn chunks_on_disk_are_linked_not_copied_and_outlive_their_store() {
        use crate::test_dir::Dir;
        let (store_dir, checkpoint) = (Dir::new("ckpt-store"), Dir::new("ckpt-linked"));
        let store = ChunkStore::open(&store_dir.0, 1 << 20).unwrap();
        let stored = |key: u64| store.store(chunk(key).data()).unwrap();
        let a = table("a", SelectorKind::Fifo, 10);
        let shared = stored(7);
        for k in 1..=4u64 {
            a.try_insert(item(k, vec![shared.clone(), stored(100 + k)]), k as f64)
                .unwrap();
        }
        assert!(shared.is_stored());
        std::fs::create_dir_all(&checkpoint.0).unwrap();
        let mut bytes = Vec::new();
        write(&mut bytes, &[(&a, &a.snapshot())], Some(&checkpoint.0)).unwrap();
        // No chunk's data is in the file; its store's segment is linked beside it.
        for key in [7, 101, 104] {
            let data = content(key);
            assert!(!bytes.windows(data.len()).any(|w| w == data), "chunk {key}");
        }
        let segments: Vec<_> = std::fs::read_dir(checkpoint.0.join(SEGMENTS))
            .unwrap()
            .collect();
        assert_eq!(segments.len(), 1);
        // The store and everything it held go; the checkpoint still has all of it.
        let expected: Vec<_> = (1..=4u64)
            .map(|k| (k, [chunk(7).data(), chunk(100 + k).data()]))
            .collect();
        drop((a, shared));
        store.close();
        drop(store);
        drop(store_dir);
        let Err(err) = read(&mut bytes.as_slice(), None, None) else {
            panic!("read without the checkpoint's directory")
        };
        assert!(err.to_string().contains("linked segment"), "{err}");
        let restored_dir = Dir::new("ckpt-restored");
        let restored_store = ChunkStore::open(&restored_dir.0, 1 << 20).unwrap();
        for store in [None, Some(&restored_store)] {
            let saved = read(&mut bytes.as_slice(), Some(&checkpoint.0), store).unwrap();
            let items = &saved["a"].snapshot.items;
            assert_eq!(items.len(), 4);
            for ((item, _, _), (key, chunks)) in items.iter().zip(&expected) {
                assert_eq!(item.key, *key);
                for (got, want) in item.chunks().iter().zip(chunks) {
                    assert_eq!(got.is_stored(), store.is_some());
                    assert_eq!(&got.resident().unwrap().data(), want);
                }
            }
        }
        let mut reader = Reader::open(std::io::Cursor::new(bytes.clone()))
            .unwrap()
            .linked_in(&checkpoint.0);
        assert_eq!(reader.chunk(103).unwrap(), chunk(103).data());
        // A flipped byte in the linked segment is caught.
        let segment = segments[0].as_ref().unwrap().path();
        let mut raw = std::fs::read(&segment).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        std::fs::write(&segment, raw).unwrap();
        let Err(err) = read(&mut bytes.as_slice(), Some(&checkpoint.0), None) else {
            panic!("read a flipped byte")
        };
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    #[test]
    fn every_corruption_is_detected() {
        let (_, _, bytes) = filled();
        for cut in [0, 5, 8, 20, bytes.len() / 2, bytes.len() - 1] {
            assert!(
                read(&mut &bytes[..cut], None, None).is_err(),
                "truncated at {cut}"
            );
        }
        for pos in [3, 12, bytes.len() / 3, bytes.len() - 3] {
            let mut bad = bytes.clone();
            bad[pos] ^= 0x40;
            assert!(
                read(&mut bad.as_slice(), None, None).is_err(),
                "flipped byte {pos}"
            );
        }
    }

    #[test]
    fn the_offline_reader_walks_each_table_in_order_and_fetches_chunks_by_key() {
        let (a, b, bytes) = filled();
        let mut reader = Reader::open(std::io::Cursor::new(bytes.clone())).unwrap();
        let names: Vec<_> = reader
            .tables()
            .iter()
            .map(|t| t.table_name.clone())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(reader.tables()[0].rate_limiter, {
            let mut one = Vec::new();
            write(&mut one, &[(&a, &a.snapshot())], None).unwrap();
            read(&mut one.as_slice(), None, None).unwrap()["a"]
                .header
                .rate_limiter
        });
        for table in [&a, &b] {
            let expected: Vec<_> = table
                .snapshot()
                .items
                .iter()
                .map(|i| (i.0.key, i.1, i.2))
                .collect();
            assert_eq!(reader.item_count(table.name()), expected.len() as u64);
            let mut cursor = reader.cursor(table.name());
            let mut got = Vec::new();
            while let Some(item) = reader.next_item(&mut cursor).unwrap() {
                assert_eq!(item.table, table.name());
                for slice in item.flat_trajectory.iter().flat_map(|t| &t.columns) {
                    for s in &slice.chunk_slices {
                        let chunk = reader.chunk(s.chunk_key).unwrap();
                        assert_eq!(chunk.chunk_key, s.chunk_key);
                    }
                }
                got.push((item.key, item.priority, item.times_sampled));
            }
            assert_eq!(got, expected);
            assert!(reader.next_item(&mut cursor).unwrap().is_none());
        }
        assert_eq!(reader.item_count("nope"), 0);
        assert!(reader
            .next_item(&mut reader.cursor("nope"))
            .unwrap()
            .is_none());
        assert!(reader.chunk(12345).is_err());
        // Everything read() refuses, the reader refuses when it opens.
        for cut in [0, 5, 8, 20, bytes.len() / 2, bytes.len() - 1] {
            let short = std::io::Cursor::new(bytes[..cut].to_vec());
            assert!(Reader::open(short).is_err(), "truncated at {cut}");
        }
        for pos in [3, 12, bytes.len() / 3, bytes.len() - 3] {
            let mut bad = bytes.clone();
            bad[pos] ^= 0x40;
            assert!(
                Reader::open(std::io::Cursor::new(bad)).is_err(),
                "flipped {pos}"
            );
        }
    }

    #[test]
    fn restore_requires_matching_names_and_changes_nothing_on_error() {
        let (_, _, bytes) = filled();
        let a2 = table("a", SelectorKind::Fifo, 10);
        let c = table("c", SelectorKind::Fifo, 10);
        let err = restore(
            &[a2.clone(), c],
            read(&mut bytes.as_slice(), None, None).unwrap(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("names must match"), "{err}");
        assert_eq!(a2.size(), 0);
    }

    /// A table that cannot take its saved items (here priorities whose weight overflows the
    /// configured exponent) fails the restore before any table, even an earlier one, changes.
    #[test]
    fn restore_checks_every_table_before_changing_any() {
        let (_, _, bytes) = filled();
        let a2 = table("a", SelectorKind::Fifo, 10);
        let b2 = table(
            "b",
            SelectorKind::Prioritized {
                priority_exponent: 1000.0,
            },
            10,
        );
        let err = restore(
            &[a2.clone(), b2.clone()],
            read(&mut bytes.as_slice(), None, None).unwrap(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("priority_exponent"), "{err}");
        assert_eq!((a2.size(), b2.size()), (0, 0));
    }

    #[test]
    fn smaller_max_size_evicts_with_the_configured_remover() {
        let (_, _, bytes) = filled();
        let a2 = table("a", SelectorKind::Fifo, 2);
        let b2 = table("b", SelectorKind::MaxHeap, 10);
        let evicted = restore(
            &[a2.clone(), b2],
            read(&mut bytes.as_slice(), None, None).unwrap(),
        )
        .unwrap();
        assert_eq!(evicted, vec![2, 0]);
        let keys: Vec<u64> = a2.snapshot().items.iter().map(|i| i.0.key).collect();
        assert_eq!(keys, vec![3, 4], "the FIFO remover dropped the oldest");
    }
}
