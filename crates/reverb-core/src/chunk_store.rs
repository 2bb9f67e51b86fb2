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
use crate::segment_log::{Recovered, SegmentLog};
use crate::Chunk;
use parking_lot::{Mutex, RwLock};
use reverb_proto::{ChunkData, KeyHashMap};
use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Bytes at which a segment of the log is sealed.
const SEGMENT_BYTES: u64 = 64 << 20;

/// A server's chunk payloads on disk (see the module's documentation). Share it as
/// `Arc<ChunkStore>`: every stored chunk holds it.
pub struct ChunkStore {
    dir: PathBuf,
    log: RwLock<Logged>,
    cache: Mutex<Cache>,
    /// Keys of chunks dropped since the log last heard of it (applied under the log's lock
    /// by the next write or [`ChunkStore::maintain`]: a chunk is often dropped under a
    /// table's lock, which must not wait for the disk).
    forgotten: Mutex<Vec<u64>>,
    counters: Counters,
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
    /// Opens the store in `dir` (created if missing) with a cache of `cache_bytes`. Fails
    /// when another server holds the directory. What the directory held from an earlier run
    /// is dropped: items are not kept across restarts yet, so no chunk is referenced.
    pub fn open(dir: &Path, cache_bytes: usize) -> io::Result<Arc<Self>> {
        let (mut log, _found): (SegmentLog, Recovered) = SegmentLog::open(dir, SEGMENT_BYTES)
            .map_err(|e| context(dir, "could not be opened", e))?;
        log.retain(|_| false)
            .map_err(|e| context(dir, "could not be cleared", e))?;
        Ok(Arc::new(Self {
            dir: dir.to_path_buf(),
            log: RwLock::new(Logged {
                log,
                again: KeyHashMap::default(),
            }),
            cache: Mutex::new(Cache::new(cache_bytes)),
            forgotten: Mutex::new(Vec::new()),
            counters: Counters::default(),
        }))
    }

    /// The directory it stores in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stores a received chunk: its payload written to disk (and kept in the cache), unless
    /// it is small enough to stay in memory. On an error (a full disk) nothing of it stays.
    pub fn store(self: &Arc<Self>, data: ChunkData) -> io::Result<Arc<Chunk>> {
        if Chunk::kept_in_memory(&data) {
            return Ok(Arc::new(Chunk::new(data)));
        }
        let key = data.chunk_key;
        let resident = Arc::new(Chunk::new(data.clone()));
        {
            let mut record = Vec::with_capacity(STORED_HEADER + data.data.len());
            record.extend_from_slice(&resident.header());
            record.extend_from_slice(&data.data);
            let mut logged = self.log.write();
            self.apply_forgotten(&mut logged);
            if logged.log.contains(key) {
                *logged.again.entry(key).or_default() += 1;
            } else if let Err(e) = logged.log.put(key, &record) {
                self.counters.errors.fetch_add(1, Ordering::Relaxed);
                return Err(context(&self.dir, "could not store a chunk", e));
            }
        }
        self.cache.lock().insert(key, resident);
        Ok(Arc::new(Chunk::stored(data, self.clone())))
    }

    /// `chunk` (stored here) with its payload in memory, from the cache or the disk.
    pub(crate) fn load(&self, chunk: &Chunk) -> io::Result<Arc<Chunk>> {
        let key = chunk.key();
        if let Some(hit) = self.cache.lock().get(key) {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(hit);
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let read = self.log.read().log.get(key);
        self.counters
            .read_nanos
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let failed = |e: io::Error| {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            context(&self.dir, &format!("could not read chunk {key}"), e)
        };
        let mut record = match read {
            Ok(Some(record)) => record,
            Ok(None) => {
                return Err(failed(io::Error::new(
                    io::ErrorKind::NotFound,
                    "it is missing",
                )))
            }
            Err(e) => return Err(failed(e)),
        };
        if record.len() < STORED_HEADER || record[..STORED_HEADER] != chunk.header() {
            return Err(failed(io::Error::new(
                io::ErrorKind::InvalidData,
                "its stored fields differ from the chunk's",
            )));
        }
        record.drain(..STORED_HEADER);
        let resident = Arc::new(chunk.with_bytes(record));
        self.cache.lock().insert(key, resident.clone());
        Ok(resident)
    }

    /// Called as a stored chunk is dropped: its payload is forgotten (see `forgotten`).
    pub(crate) fn forget(&self, key: u64) {
        self.cache.lock().remove(key);
        self.forgotten.lock().push(key);
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
            self.apply_forgotten(&mut self.log.write());
        }
    }

    /// What it holds and has done.
    pub fn stats(&self) -> StoreStats {
        let (cache_bytes, cache_limit) = {
            let cache = self.cache.lock();
            (cache.bytes, cache.limit)
        };
        let logged = self.log.read();
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
    map: KeyHashMap<(Arc<Chunk>, bool)>,
    /// Keys in the order the hand visits them (some since removed from `map`).
    ring: VecDeque<u64>,
    bytes: usize,
    limit: usize,
}

impl Cache {
    fn new(limit: usize) -> Self {
        Self {
            map: KeyHashMap::default(),
            ring: VecDeque::new(),
            bytes: 0,
            limit,
        }
    }

    fn get(&mut self, key: u64) -> Option<Arc<Chunk>> {
        let (chunk, used) = self.map.get_mut(&key)?;
        *used = true;
        Some(chunk.clone())
    }

    fn insert(&mut self, key: u64, chunk: Arc<Chunk>) {
        let size = chunk.byte_size();
        if size > self.limit || self.map.contains_key(&key) {
            return;
        }
        while self.bytes + size > self.limit && self.evict_one() {}
        self.bytes += size;
        self.map.insert(key, (chunk, false));
        self.ring.push_back(key);
        if self.ring.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.ring.retain(|k| map.contains_key(k));
        }
    }

    fn remove(&mut self, key: u64) {
        if let Some((chunk, _)) = self.map.remove(&key) {
            self.bytes -= chunk.byte_size();
        }
    }

    /// Evicts the first chunk the hand finds unused since its last pass; false when empty.
    fn evict_one(&mut self) -> bool {
        while let Some(key) = self.ring.pop_front() {
            match self.map.get_mut(&key) {
                None => {}
                Some((_, used)) if *used => {
                    *used = false;
                    self.ring.push_back(key);
                }
                Some(_) => {
                    self.remove(key);
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
