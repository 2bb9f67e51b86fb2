//! Chunk payloads on disk behind a cache bounded in bytes (a server's `storage`): a table's
//! chunks keep their fields in memory and their payloads in a [`SegmentLog`] under one
//! directory; sampling reads them back through the cache ([`Chunk::resident`]). Small
//! payloads (those a chunk's record holds itself) stay in memory: storing them would save
//! nothing. A payload is written when its chunk arrives and forgotten when the last item
//! referencing it is gone (the log reclaims the space: see its documentation).
//!
//! A chunk key sent again while its chunk is stored (a writer sending a chunk anew on another
//! stream) is counted, not written again: the payload is forgotten with the last of them.

use crate::chunk::STORED_HEADER;
use crate::segment_log::{Place, Recovered, SegmentLog};
use crate::Chunk;
use parking_lot::{Mutex, RwLock};
use reverb_proto::{ChunkData, KeyHashMap};
use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Bytes at which a segment of the log is sealed.
const SEGMENT_BYTES: u64 = 64 << 20;

/// A server's chunk payloads on disk (see the module's documentation). Share it as
/// `Arc<ChunkStore>`: every stored chunk holds it.
pub struct ChunkStore {
    dir: PathBuf,
    /// None once closed.
    log: RwLock<Option<Logged>>,
    cache: Mutex<Cache>,
    /// Keys of chunks dropped since the log last heard of it (applied under the log's lock
    /// by [`ChunkStore::maintain`], which a server calls every second: a chunk is often
    /// dropped under a table's lock, and deleting may compact, which neither that lock nor
    /// an insert should wait for).
    forgotten: Mutex<Vec<u64>>,
    /// Buffers of payloads read back and since dropped, by size class, for the next reads.
    spare: Mutex<Spare>,
    /// The cache's bound (the spare buffers' is a quarter of it).
    cache_limit: usize,
    closed: AtomicBool,
    counters: Counters,
}

/// Payload buffers given back, by size class (see [`ChunkStore::give_back`]).
#[derive(Default)]
struct Spare {
    by_class: std::collections::HashMap<usize, Vec<Vec<u8>>>,
    /// Capacity of the buffers held.
    bytes: usize,
}

/// Bytes of spare buffers kept at most: enough for the reads of a second's batches to reuse
/// what the cache evicted, little next to the cache (a quarter of it, at least 1 MiB).
const SPARE_BYTES: usize = 16 << 20;

/// The capacity of the size class holding `len` bytes: `len` rounded up to a quarter of its
/// power of two (payloads of nearby lengths share buffers; at most 25% unused).
fn size_class(len: usize) -> usize {
    if len <= 64 {
        return 64;
    }
    let quarter = len.next_power_of_two() / 8;
    len.div_ceil(quarter) * quarter
}

struct Logged {
    log: SegmentLog,
    /// Keys stored more than once, with how many more times.
    again: KeyHashMap<u32>,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    read_nanos: AtomicU64,
    errors: AtomicU64,
}

/// What a chunk store holds and has done (the server's metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreStats {
    /// Chunks whose payload is on disk.
    pub chunks: usize,
    /// Bytes the log's files take.
    pub disk_bytes: u64,
    /// Bytes of live records in them.
    pub live_bytes: u64,
    /// Bytes compaction copied since opening.
    pub compacted_bytes: u64,
    /// Payload bytes the cache holds, and its bound.
    pub cache_bytes: usize,
    /// The cache's bound.
    pub cache_limit: usize,
    /// Reads the cache answered.
    pub hits: u64,
    /// Reads that went to disk.
    pub misses: u64,
    /// Seconds those reads took, in all.
    pub read_seconds: f64,
    /// Reads and writes that failed.
    pub errors: u64,
}

impl ChunkStore {
    /// Opens the store in `dir` (created if missing) with a cache of `cache_bytes`, holding
    /// what the directory held (see [`ChunkStore::recovered`], [`ChunkStore::retain`]). Fails
    /// when another server holds the directory.
    pub fn open(dir: &Path, cache_bytes: usize) -> io::Result<Arc<Self>> {
        let (log, _found): (SegmentLog, Recovered) = SegmentLog::open(dir, SEGMENT_BYTES)
            .map_err(|e| context(dir, "could not be opened", e))?;
        Ok(Arc::new(Self {
            dir: dir.to_path_buf(),
            log: RwLock::new(Some(Logged {
                log,
                again: KeyHashMap::default(),
            })),
            cache: Mutex::new(Cache::new(cache_bytes)),
            forgotten: Mutex::new(Vec::new()),
            spare: Mutex::new(Spare::default()),
            cache_limit: cache_bytes,
            closed: AtomicBool::new(false),
            counters: Counters::default(),
        }))
    }

    /// The directory it stores in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stores a received chunk: its payload written to disk (and kept in the cache), unless
    /// it is small enough to stay in memory. On an error (a full disk) nothing of it stays.
    /// A key stored already must come with the same data (else InvalidInput): chunk keys
    /// are the writers', and one writer's mistake must not change another's items.
    pub fn store(self: &Arc<Self>, data: ChunkData) -> io::Result<Arc<Chunk>> {
        if Chunk::kept_in_memory(&data) {
            return Ok(Arc::new(Chunk::new(data)));
        }
        let key = data.chunk_key;
        let size = data.data.len();
        let header = Chunk::header_of(&data);
        let record: [&[u8]; 2] = [&header, &data.data];
        {
            let mut guard = self.log.write();
            let logged = guard.as_mut().ok_or_else(|| self.closed())?;
            if logged.log.contains(key) {
                let same = logged
                    .log
                    .holds(key, &record)
                    .map_err(|e| context(&self.dir, &format!("could not read chunk {key}"), e))?;
                if !same {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "Chunk {key} is stored already with other data: chunk keys must \
                             be unique"
                        ),
                    ));
                }
                *logged.again.entry(key).or_default() += 1;
            } else if let Err(e) = logged.log.put_parts(key, &record) {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                return Err(context(&self.dir, "could not store a chunk", e));
            }
        }
        // (Made only once stored: dropping it forgets the key.)
        let stored = Arc::new(Chunk::stored(data.clone(), self.clone()));
        let skip = {
            let cache = self.cache.lock();
            size > cache.limit || cache.holds(key)
        };
        if !skip {
            let mut copy = self.lend(size);
            copy.copy_from_slice(&data.data);
            let resident = Arc::new(stored.with_lent(copy, self.clone()));
            self.cache.lock().insert(key, resident);
        }
        Ok(stored)
    }

    /// Chunk `key` as the journal recorded it (its fields `header`, its payload if kept in
    /// memory), after a restart: None when its payload should be here and is not.
    pub(crate) fn recovered(
        self: &Arc<Self>,
        key: u64,
        header: &[u8; STORED_HEADER],
        payload: Option<&[u8]>,
    ) -> Option<Arc<Chunk>> {
        let payload = match payload {
            Some(bytes) => Ok(bytes),
            None => {
                let len = self.log.read().as_ref()?.log.payload_len(key)? as usize;
                Err((self.clone(), len.checked_sub(STORED_HEADER)?))
            }
        };
        Chunk::from_header(key, header, payload).map(Arc::new)
    }

    /// Keeps only the payloads `keep` says yes to (after a restart: those the recovered
    /// items reference).
    pub fn retain(&self, keep: impl FnMut(u64) -> bool) -> io::Result<()> {
        let mut guard = self.log.write();
        let logged = guard.as_mut().ok_or_else(|| self.closed())?;
        self.apply_forgotten(logged);
        logged
            .log
            .retain(keep)
            .map_err(|e| context(&self.dir, "could not delete unreferenced chunks", e))
    }

    /// Makes every payload stored so far durable.
    pub fn sync(&self) -> io::Result<()> {
        // (Synced outside the log's lock: writes go on meanwhile.)
        let active = match self.log.read().as_ref() {
            Some(logged) => logged.log.active_file(),
            None => return Err(self.closed()),
        };
        active
            .and_then(|file| file.sync_data())
            .map_err(|e| context(&self.dir, "could not be synced", e))
    }

    /// Hard-links the segment holding chunk `key`'s record into `into` (see
    /// [`SegmentLog::link`]: a checkpoint references the record instead of copying it),
    /// sealing the active segment first if it is there: a linked file never changes.
    pub(crate) fn link(
        &self,
        key: u64,
        into: &Path,
        linked: &mut std::collections::HashSet<u64>,
    ) -> io::Result<Option<Place>> {
        // (Reads go on meanwhile; only a seal excludes them, briefly.)
        let guard = self.log.upgradable_read();
        let logged = guard.as_ref().ok_or_else(|| self.closed())?;
        match logged.log.place(key) {
            None => Ok(None),
            Some(place) if place.segment == logged.log.active() => {
                let mut guard = parking_lot::RwLockUpgradableReadGuard::upgrade(guard);
                let logged = guard.as_mut().expect("open: checked above");
                logged.log.seal_and_link(key, into, linked)
            }
            Some(_) => logged.log.link(key, into, linked),
        }
    }

    /// Closes the store (its server stopped): payloads stay on disk for the next server on
    /// the directory, which is released. Chunks still held elsewhere can no longer be read,
    /// and dropping them forgets nothing.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.forgotten.lock().clear();
        *self.log.write() = None;
        let mut cache = self.cache.lock();
        *cache = Cache::new(cache.limit);
        drop(cache);
        *self.spare.lock() = Spare::default();
    }

    fn closed(&self) -> io::Error {
        io::Error::other(format!(
            "The chunk store in {} is closed (its server stopped)",
            self.dir.display()
        ))
    }

    /// A buffer of `len` bytes for a payload read back: a spare one of its size class, else
    /// a new one. (Its bytes are all overwritten by the read.)
    fn lend(&self, len: usize) -> Vec<u8> {
        let class = size_class(len);
        let spare = {
            let mut spare = self.spare.lock();
            let bucket = spare.by_class.get_mut(&class);
            let buffer = bucket.and_then(Vec::pop);
            if let Some(buffer) = &buffer {
                spare.bytes -= buffer.capacity();
            }
            buffer
        };
        let mut buffer = spare.unwrap_or_else(|| Vec::with_capacity(class));
        buffer.clear();
        buffer.resize(len, 0);
        buffer
    }

    /// Takes back the buffer of a payload read back (its chunk went), for the next read of
    /// its size class. The spare buffers stay under a quarter of the cache (at least 1 MiB,
    /// at most [`SPARE_BYTES`]): past it, they are all freed (the sizes asked for changed).
    pub(crate) fn give_back(&self, buffer: Vec<u8>) {
        let class = size_class(buffer.capacity());
        if class != buffer.capacity() || self.closed.load(Ordering::Relaxed) {
            return; // (not one of ours)
        }
        let limit = (self.cache_limit / 4).clamp(1 << 20, SPARE_BYTES);
        let mut spare = self.spare.lock();
        if spare.bytes + class > limit {
            *spare = Spare::default();
            if class > limit {
                return;
            }
        }
        spare.bytes += class;
        spare.by_class.entry(class).or_default().push(buffer);
    }

    /// `chunk` (stored here) with its payload in memory, from the cache or the disk (kept
    /// in the cache if `cache`).
    pub(crate) fn load(self: &Arc<Self>, chunk: &Chunk, cache: bool) -> io::Result<Arc<Chunk>> {
        let key = chunk.key();
        if let Some(hit) = self.cache.lock().get(key) {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(hit);
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let mut header = [0u8; STORED_HEADER];
        let read = match self.log.read().as_ref() {
            Some(logged) => logged.log.get_into(key, &mut header, |len| self.lend(len)),
            None => Err(self.closed()),
        };
        self.counters
            .read_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let failed = |e: io::Error| {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            context(&self.dir, &format!("could not read chunk {key}"), e)
        };
        let payload = match read {
            Ok(Some(payload)) => payload,
            Ok(None) => {
                return Err(failed(io::Error::new(
                    io::ErrorKind::NotFound,
                    "it is missing",
                )))
            }
            Err(e) => return Err(failed(e)),
        };
        if header != chunk.header() {
            return Err(failed(io::Error::new(
                io::ErrorKind::InvalidData,
                "its stored fields differ from the chunk's",
            )));
        }
        let resident = Arc::new(chunk.with_lent(payload, self.clone()));
        if cache {
            self.cache.lock().insert(key, resident.clone());
        }
        Ok(resident)
    }

    /// Starts reading `chunk`'s payload from disk unless the cache holds it (see
    /// [`SegmentLog::will_need`]).
    pub(crate) fn will_need(&self, chunk: &Chunk) {
        let key = chunk.key();
        if self.cache.lock().holds(key) {
            return;
        }
        if let Some(logged) = self.log.read().as_ref() {
            logged.log.will_need(key);
        }
    }

    /// Called as a stored chunk is dropped: its payload is forgotten (see `forgotten`).
    pub(crate) fn forget(&self, key: u64) {
        self.cache.lock().remove(key);
        // (After closing, what a dropped chunk held stays for the next server, whose journal
        // says what is referenced.)
        if !self.closed.load(Ordering::Relaxed) {
            self.forgotten.lock().push(key);
        }
    }

    fn apply_forgotten(&self, logged: &mut Logged) {
        let keys = std::mem::take(&mut *self.forgotten.lock());
        for key in keys {
            match logged.again.get_mut(&key) {
                Some(1) => {
                    logged.again.remove(&key);
                }
                Some(n) => *n -= 1,
                None => {
                    if logged.log.delete(key).is_err() {
                        self.counters.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// Forgets the payloads of chunks dropped since the last write (their space comes back
    /// as the log reclaims it). A server calls it now and then.
    pub fn maintain(&self) {
        if !self.forgotten.lock().is_empty() {
            if let Some(logged) = self.log.write().as_mut() {
                self.apply_forgotten(logged);
            }
        }
    }

    /// What it holds and has done.
    pub fn stats(&self) -> StoreStats {
        let (cache_bytes, cache_limit) = {
            let cache = self.cache.lock();
            (cache.bytes, cache.limit)
        };
        let guard = self.log.read();
        let Some(logged) = guard.as_ref() else {
            return StoreStats::default();
        };
        let (disk_bytes, live_bytes) = logged.log.bytes();
        StoreStats {
            chunks: logged.log.len(),
            disk_bytes,
            live_bytes,
            compacted_bytes: logged.log.copied(),
            cache_bytes,
            cache_limit,
            hits: self.counters.hits.load(Ordering::Relaxed),
            misses: self.counters.misses.load(Ordering::Relaxed),
            read_seconds: self.counters.read_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
            errors: self.counters.errors.load(Ordering::Relaxed),
        }
    }
}

impl std::fmt::Debug for ChunkStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkStore({})", self.dir.display())
    }
}

/// `e` saying which store and what failed (a full disk keeps its kind: the server answers
/// it with RESOURCE_EXHAUSTED).
fn context(dir: &Path, what: &str, e: io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("The chunk store in {} {what}: {e}", dir.display()),
    )
}

/// Whether `e` says the disk (or the user's quota) is full.
pub fn is_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge
    )
}

/// Resident copies of stored chunks, bounded by their payload bytes; evicts by CLOCK (a
/// chunk read since the hand last passed gets another round).
struct Cache {
    /// Every key in `ring`, once: with its chunk and whether it was read since the hand
    /// passed, or removed (`None`) and waiting for the hand to pass.
    map: KeyHashMap<(Option<Arc<Chunk>>, bool)>,
    /// Keys in the order the hand visits them.
    ring: VecDeque<u64>,
    bytes: usize,
    limit: usize,
    /// Removed keys still in the ring.
    removed: usize,
}

impl Cache {
    fn new(limit: usize) -> Self {
        Self {
            map: KeyHashMap::default(),
            ring: VecDeque::new(),
            bytes: 0,
            limit,
            removed: 0,
        }
    }

    /// Whether it holds chunk `key` (not just its key waiting for the hand).
    fn holds(&self, key: u64) -> bool {
        self.map.get(&key).is_some_and(|(c, _)| c.is_some())
    }

    fn get(&mut self, key: u64) -> Option<Arc<Chunk>> {
        let (chunk, used) = self.map.get_mut(&key)?;
        let chunk = chunk.clone()?;
        *used = true;
        Some(chunk)
    }

    fn insert(&mut self, key: u64, chunk: Arc<Chunk>) {
        let size = chunk.byte_size();
        if size > self.limit || self.holds(key) {
            return;
        }
        while self.bytes + size > self.limit && self.evict_one() {}
        self.bytes += size;
        match self.map.get_mut(&key) {
            // (Still in the ring: it takes its place there again.)
            Some(slot) => {
                *slot = (Some(chunk), false);
                self.removed -= 1;
            }
            None => {
                self.map.insert(key, (Some(chunk), false));
                self.ring.push_back(key);
            }
        }
    }

    fn remove(&mut self, key: u64) {
        if let Some((slot @ Some(_), _)) = self.map.get_mut(&key) {
            self.bytes -= slot.take().expect("matched").byte_size();
            self.removed += 1;
            // Removed keys cost a ring place each until the hand passes: when they are most
            // of the ring (a cache that never fills), they are swept at once.
            if self.removed > 64 && self.removed * 2 > self.map.len() {
                self.map.retain(|_, (c, _)| c.is_some());
                let map = &self.map;
                self.ring.retain(|k| map.contains_key(k));
                self.removed = 0;
            }
        }
    }

    /// Evicts the first chunk the hand finds unused since its last pass; false when empty.
    fn evict_one(&mut self) -> bool {
        while let Some(key) = self.ring.pop_front() {
            match self.map.get_mut(&key) {
                None => {}
                Some((None, _)) => {
                    self.map.remove(&key);
                    self.removed -= 1;
                }
                Some((Some(_), used)) if *used => {
                    *used = false;
                    self.ring.push_back(key);
                }
                Some((Some(chunk), _)) => {
                    self.bytes -= chunk.byte_size();
                    self.map.remove(&key);
                    return true;
                }
            }
        }
        false
    }
}

#[cfg(test)]
#[path = "chunk_store_tests.rs"]
mod tests;
