//! The log of a disk-backed server's table changes: what makes its tables survive a crash
//! (issue 43). Every change a table makes (an item inserted, its priority updated, an item
//! deleted, the table reset) is appended, under the table's lock and so in its order, to a
//! buffer that a background thread writes to the journal file and syncs every
//! `sync_interval`, after syncing the chunk store (an item's record names chunks whose
//! payloads must be on disk first). The rate limiter's counters are logged at each sync when
//! they changed. An inserted item's record carries its chunks' fields, and the payloads kept
//! in memory (small ones: see [`ChunkStore`]); the others are in the chunk store.
//!
//! Opening replays the newest journal file (a record cut short at its end, a write a crash
//! interrupted, ends it) into table snapshots: items in insertion order with their priorities,
//! the counters. [`Journal::attach`] then starts a new file with the tables' contents as its
//! first records (so a journal holds one snapshot and the changes since), and the old one is
//! deleted. Replaying a change on a state that already has it changes nothing (an insert of
//! a held key updates its priority, a delete of a missing key is ignored), which is what lets
//! a new file start while the tables change.
//!
//! Record: `[len u32][crc32 u32][body]`, body `[kind u8][table u16][fields]`.

use crate::chunk::STORED_HEADER;
use crate::chunk_store::ChunkStore;
use crate::{Chunk, ItemData, Table, TableSnapshot};
use parking_lot::{Condvar, Mutex};
use prost::Message;
use reverb_proto::{KeyHashMap, PrioritizedItem};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

const TABLES: u8 = 1;
const INSERT: u8 = 2;
const PRIORITY: u8 = 3;
const DELETE: u8 = 4;
const RESET: u8 = 5;
const COUNTERS: u8 = 6;

/// Buffered bytes past which the writer thread is woken before the interval ends.
const WAKE_BYTES: usize = 8 << 20;
/// Bytes of a journal file below which it is never started afresh.
const REWRITE_BYTES: u64 = 64 << 20;

/// A table's counters as logged: rate limiter (inserts, samples, deletes), deleted episodes,
/// unique samples.
pub(crate) type Counters = [i64; 5];

fn journal_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("journal-{generation:016x}.log"))
}

/// Where the file of `generation` is written before it is published.
fn tmp_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("journal-{generation:016x}.tmp"))
}

/// What opening a journal found.
#[derive(Debug, Default)]
pub struct Recovery {
    /// The tables' contents by name, as of the last change that reached the disk.
    pub tables: BTreeMap<String, TableSnapshot>,
    /// Whether there was a journal at all (a new directory has none).
    pub found: bool,
    /// Bytes cut off the end of the journal (a write a crash interrupted).
    pub torn_bytes: u64,
    /// Items left out because a chunk they reference was not in the chunk store (lost
    /// or corrupt), and the first such chunk's key.
    pub dropped_items: usize,
}

/// The journal of one storage directory (see the module's documentation).
pub struct Journal {
    dir: PathBuf,
    store: Arc<ChunkStore>,
    sync_interval: Duration,
    /// Changes not yet written (appended to under the tables' locks: never held long).
    pending: Mutex<Pending>,
    wake: Condvar,
    /// The file and what was written to it (held while writing and syncing).
    file: Mutex<FileState>,
    /// Held by a sync from taking the buffer to its end: one at a time, in order.
    syncing: Mutex<()>,
    /// Why the last write failed (the disk is full, say), until one succeeds.
    failed: Mutex<Option<(io::ErrorKind, String)>>,
    /// The tables attached, by their index in the current file.
    tables: Mutex<Vec<Weak<Table>>>,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// [`REWRITE_BYTES`] (smaller in tests).
    rewrite_bytes: AtomicU64,
    /// Held while a new file is written (one at a time).
    rewriting: Mutex<()>,
    /// Bytes of changes durable so far (of `Pending::appended`), and its waiters.
    synced_to: AtomicU64,
    synced: tokio::sync::Notify,
    /// Syncs that wrote something, and the nanoseconds they took.
    syncs: AtomicU64,
    sync_nanos: AtomicU64,
    /// Nanoseconds a sync is expected to take: the longest of late (decaying by an eighth
    /// a sync). A sync starts that long (twice) before its oldest change is due.
    sync_cost: AtomicU64,
    /// When a sync longer than half the interval was last reported on stderr.
    slow_reported: Mutex<Option<std::time::Instant>>,
    /// `FileState::file_bytes` as last written (read without the lock held across syncs).
    file_bytes: AtomicU64,
    /// Milliseconds every sync sleeps (tests: a slow disk).
    #[cfg(test)]
    slow_sync_ms: AtomicU64,
    /// Whether syncs fail (tests: a full disk), and how many were tried.
    #[cfg(test)]
    fail_syncs: AtomicBool,
    #[cfg(test)]
    sync_tries: AtomicU64,
}

/// What a journal holds and has done (the server's metrics).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JournalStats {
    /// Bytes of the current file.
    pub bytes: u64,
    /// Syncs that wrote changes.
    pub syncs: u64,
    /// Seconds they took, in all (the chunk store's sync included).
    pub sync_seconds: f64,
}

struct Pending {
    buf: Vec<u8>,
    /// Bytes of changes appended since opening.
    appended: u64,
    /// The most of them a caller of [`Journal::durable`] waits for: the writer thread does
    /// not sleep while they are not synced.
    wanted: u64,
    /// When the oldest change in `buf` was appended.
    since: Option<std::time::Instant>,
}

struct FileState {
    file: Option<File>,
    /// The next file's generation.
    generation: u64,
    /// Bytes of the current file (all whole records), and of the snapshot it began with.
    file_bytes: u64,
    snapshot_bytes: u64,
    /// While a new file is being written: the changes synced meanwhile, for it too.
    carry: Option<Vec<u8>>,
}

/// A table's end of the journal (held in its state, used under its lock).
pub(crate) struct TableJournal {
    journal: Arc<Journal>,
    index: u16,
    /// The counters last logged.
    logged: Counters,
}

impl std::fmt::Debug for TableJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TableJournal({})", self.index)
    }
}

impl TableJournal {
    fn record(&self, kind: u8, fields: impl FnOnce(&mut Vec<u8>)) {
        self.journal.append(kind, self.index, fields);
    }

    /// A new item was stored.
    pub(crate) fn inserted(&self, item: &ItemData, priority: f64) {
        self.record(INSERT, |out| encode_insert(out, item, priority));
    }

    /// An item's priority changed.
    pub(crate) fn priority(&self, key: u64, priority: f64) {
        self.record(PRIORITY, |out| {
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&priority.to_le_bytes());
        });
    }

    /// An item was deleted.
    pub(crate) fn deleted(&self, key: u64) {
        self.record(DELETE, |out| out.extend_from_slice(&key.to_le_bytes()));
    }

    /// Every item was deleted and the counters zeroed.
    pub(crate) fn reset(&mut self) {
        self.record(RESET, |_| {});
        self.logged = [0; 5];
    }

    /// Logs the counters when they changed since last logged.
    pub(crate) fn counters(&mut self, counters: Counters) {
        if counters != self.logged {
            self.logged = counters;
            self.record(COUNTERS, |out| {
                counters
                    .iter()
                    .for_each(|c| out.extend_from_slice(&c.to_le_bytes()))
            });
        }
    }
}

fn encode_insert(out: &mut Vec<u8>, item: &ItemData, priority: f64) {
    out.extend_from_slice(&priority.to_le_bytes());
    let proto = item.to_proto("", priority, 0);
    out.extend_from_slice(&(proto.encoded_len() as u32).to_le_bytes());
    proto.encode(out).expect("a Vec has room");
    out.extend_from_slice(&(item.chunks().len() as u32).to_le_bytes());
    for chunk in item.chunks() {
        out.extend_from_slice(&chunk.key().to_le_bytes());
        out.extend_from_slice(&chunk.header());
        if chunk.is_stored() {
            out.push(0);
        } else {
            out.push(1);
            out.extend_from_slice(&(chunk.payload().len() as u32).to_le_bytes());
            out.extend_from_slice(chunk.payload());
        }
    }
}

impl Journal {
    /// Opens the journal in `dir` (the chunk store's directory, which `store` holds locked)
    /// and replays it. Chunks the replayed items do not reference are deleted from `store`.
    pub fn open(
        dir: &Path,
        store: Arc<ChunkStore>,
        sync_interval: Duration,
    ) -> io::Result<(Arc<Self>, Recovery)> {
        let mut generations: Vec<u64> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                u64::from_str_radix(name.strip_prefix("journal-")?.strip_suffix(".log")?, 16).ok()
            })
            .collect();
        generations.sort_unstable();
        let mut recovery = Recovery::default();
        if let Some(&newest) = generations.last() {
            recovery.found = true;
            replay(&journal_path(dir, newest), &store, &mut recovery)?;
        }
        let referenced: std::collections::HashSet<u64> = recovery
            .tables
            .values()
            .flat_map(|t| t.items.iter())
            .flat_map(|(item, _, _)| item.chunks().iter().map(|c| c.key()))
            .collect();
        store.retain(|key| referenced.contains(&key))?;
        let journal = Arc::new(Self {
            dir: dir.to_path_buf(),
            store,
            sync_interval,
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                appended: 0,
                wanted: 0,
                since: None,
            }),
            wake: Condvar::new(),
            file: Mutex::new(FileState {
                file: None,
                generation: generations.last().map_or(0, |g| g + 1),
                file_bytes: 0,
                snapshot_bytes: 0,
                carry: None,
            }),
            syncing: Mutex::new(()),
            failed: Mutex::new(None),
            tables: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            rewrite_bytes: AtomicU64::new(REWRITE_BYTES),
            rewriting: Mutex::new(()),
            synced_to: AtomicU64::new(0),
            synced: tokio::sync::Notify::new(),
            syncs: AtomicU64::new(0),
            sync_nanos: AtomicU64::new(0),
            sync_cost: AtomicU64::new(0),
            slow_reported: Mutex::new(None),
            #[cfg(test)]
            slow_sync_ms: AtomicU64::new(0),
            #[cfg(test)]
            fail_syncs: AtomicBool::new(false),
            #[cfg(test)]
            sync_tries: AtomicU64::new(0),
            file_bytes: AtomicU64::new(0),
        });
        Ok((journal, recovery))
    }

    /// Starts a new journal file holding `tables`' contents (the recovered or restored ones),
    /// deletes the older files, then logs every change of the tables, synced by a thread of
    /// its own every `sync_interval` (stopped by [`Journal::close`]).
    pub fn attach(self: &Arc<Self>, tables: &[Arc<Table>]) -> io::Result<()> {
        if tables.len() > usize::from(u16::MAX) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a journal holds at most 65535 tables",
            ));
        }
        let (tmp, file, written, counters) = self.write_snapshot(tables, false)?;
        self.publish(tmp, file, written, Vec::new())?;
        *self.tables.lock() = tables.iter().map(Arc::downgrade).collect();
        for (index, (table, logged)) in tables.iter().zip(counters).enumerate() {
            table.set_journal(Some(TableJournal {
                journal: self.clone(),
                index: index as u16,
                logged,
            }));
        }
        let journal = self.clone();
        let thread = std::thread::Builder::new()
            .name("reverb-journal".into())
            .spawn(move || journal.run())?;
        *self.thread.lock() = Some(thread);
        Ok(())
    }

    /// Writes the next generation's file (as a temporary file): the table list, then each
    /// table's items and counters. With `syncing`, the changes made meanwhile keep being
    /// synced (to the current file) as it goes. Returns the temporary path, the file, its
    /// bytes and the counters written.
    fn write_snapshot(
        &self,
        tables: &[Arc<Table>],
        syncing: bool,
    ) -> io::Result<(PathBuf, File, u64, Vec<Counters>)> {
        let generation = self.file.lock().generation;
        let tmp = tmp_path(&self.dir, generation);
        let mut out = Counted(
            io::BufWriter::with_capacity(8 << 20, File::create(&tmp)?),
            0,
        );
        let mut body = Vec::new();
        let mut names = Vec::new();
        names.extend_from_slice(&(tables.len() as u16).to_le_bytes());
        for t in tables {
            names.extend_from_slice(&(t.name().len() as u16).to_le_bytes());
            names.extend_from_slice(t.name().as_bytes());
        }
        write_record(&mut out, TABLES, 0, &names, &mut body)?;
        let mut all = Vec::with_capacity(tables.len());
        let mut fields = Vec::new();
        let sync_if_due = || {
            if syncing && self.due() {
                self.sync();
            }
        };
        for (index, table) in tables.iter().enumerate() {
            let index = index as u16;
            let snapshot = table.snapshot();
            for (n, (item, priority, _)) in snapshot.items.iter().enumerate() {
                fields.clear();
                encode_insert(&mut fields, item, *priority);
                write_record(&mut out, INSERT, index, &fields, &mut body)?;
                if n % 1024 == 1023 {
                    sync_if_due();
                    if syncing && self.stop.load(Ordering::Relaxed) {
                        return Err(io::Error::other("the server is stopping"));
                    }
                }
            }
            let counters = snapshot_counters(&snapshot);
            fields.clear();
            counters
                .iter()
                .for_each(|c| fields.extend_from_slice(&c.to_le_bytes()));
            write_record(&mut out, COUNTERS, index, &fields, &mut body)?;
            all.push(counters);
            sync_if_due();
        }
        let written = out.1;
        let file = out.0.into_inner().map_err(|e| e.into_error())?;
        Ok((tmp, file, written, all))
    }

    /// Makes the temporary file `tmp` (`written` bytes, then `carry`: the changes synced
    /// since it was begun) the journal, then deletes the older files. Once renamed, the new
    /// file is the one written to, whatever fails after.
    fn publish(
        &self,
        tmp: PathBuf,
        mut file: File,
        written: u64,
        carry: Vec<u8>,
    ) -> io::Result<()> {
        file.write_all(&carry)?;
        self.store.sync()?;
        file.sync_all()?;
        let path = {
            let mut state = self.file.lock();
            let path = journal_path(&self.dir, state.generation);
            fs::rename(&tmp, &path)?;
            state.file = Some(file);
            state.generation += 1;
            state.snapshot_bytes = written;
            state.file_bytes = written + carry.len() as u64;
            self.file_bytes.store(state.file_bytes, Ordering::Relaxed);
            state.carry = None;
            path
        };
        File::open(&self.dir)?.sync_all()?;
        for entry in fs::read_dir(&self.dir)?.filter_map(|e| e.ok()) {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("journal-") && entry.path() != path {
                fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }

    /// Whether a sync is due (see [`Journal::time_left`]).
    fn due(&self) -> bool {
        self.time_left(&self.pending.lock()).is_zero()
    }

    /// How long the writer thread may wait before syncing: the oldest change buffered must
    /// be durable within `sync_interval` of its confirmation, so the sync starts twice its
    /// expected length (at most half the interval) before that; with nothing buffered, the
    /// interval (the counters and the file's growth are looked at that often).
    fn time_left(&self, pending: &Pending) -> Duration {
        let Some(since) = pending.since else {
            return self.sync_interval;
        };
        // (At most a quarter of the interval: syncs come at most twice an interval, a slow
        // one does not set off a storm of them, and a change is still on time as long as
        // syncs take at most half the interval.)
        let cost = Duration::from_nanos(self.sync_cost.load(Ordering::Relaxed));
        let cost = cost.min(self.sync_interval / 4);
        (since + self.sync_interval.saturating_sub(2 * cost))
            .saturating_duration_since(std::time::Instant::now())
    }

    /// Starts the journal afresh when it has grown to more than twice its snapshot (and
    /// [`REWRITE_BYTES`]): a new file holding the tables' contents, then the changes since.
    fn rewrite_if_grown(&self) -> io::Result<()> {
        let Some(_one) = self.rewriting.try_lock() else {
            return Ok(());
        };
        {
            let mut state = self.file.lock();
            let grown = state.file_bytes > self.rewrite_bytes.load(Ordering::Relaxed)
                && state.file_bytes > 2 * state.snapshot_bytes;
            if !grown || state.file.is_none() {
                return Ok(());
            }
            state.carry = Some(Vec::new());
        }
        let tables = self.attached();
        let tmp = tmp_path(&self.dir, self.file.lock().generation);
        let result = self
            .write_snapshot(&tables, true)
            .and_then(|(tmp, file, written, _)| {
                // (No sync runs between this one and the switch to the new file: the
                // changes synced meanwhile are all in `carry`; what is still buffered goes
                // to the new file at the next sync.)
                let _syncs = self.sync_held();
                let carry = self.file.lock().carry.take().unwrap_or_default();
                self.publish(tmp, file, written, carry)
            });
        let mut state = self.file.lock();
        state.carry = None;
        if result.is_err() {
            // Not tried again before the file has doubled (a full disk must not
            // be made fuller every second), and no temporary file is left to fill it.
            state.snapshot_bytes = state.file_bytes;
            drop(state);
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    fn append(&self, kind: u8, table: u16, fields: impl FnOnce(&mut Vec<u8>)) {
        let mut guard = self.pending.lock();
        let pending = &mut *guard;
        let start = pending.buf.len();
        if start == 0 {
            // (The writer thread learns when the oldest change is due.)
            pending.since = Some(std::time::Instant::now());
            self.wake.notify_one();
        }
        let buf = &mut pending.buf;
        buf.extend_from_slice(&[0u8; 8]);
        buf.push(kind);
        buf.extend_from_slice(&table.to_le_bytes());
        fields(buf);
        let body = &buf[start + 8..];
        let (len, crc) = (body.len() as u32, crc32fast::hash(body));
        buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
        buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        pending.appended += (8 + len) as u64;
        if buf.len() >= WAKE_BYTES && start < WAKE_BYTES {
            self.wake.notify_one();
        }
    }

    /// The writer thread: every `sync_interval` (sooner when much is buffered, or a caller
    /// waits for durability), syncs; starts the file afresh when it has grown.
    fn run(self: Arc<Self>) {
        // After a failed sync (a full disk, say), when the next may be tried.
        let mut retry_at: Option<std::time::Instant> = None;
        loop {
            {
                let mut pending = self.pending.lock();
                // (Checked under the lock `close`, `durable` and `append` notify under: no
                // wake-up is missed, even one made while the last sync ran.)
                loop {
                    if self.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let retry_in = retry_at.map_or(Duration::ZERO, |at| {
                        at.saturating_duration_since(std::time::Instant::now())
                    });
                    if !retry_in.is_zero() {
                        // (Nothing hurries a retry: not a waiter, not a full buffer.)
                        self.wake.wait_for(&mut pending, retry_in);
                        continue;
                    }
                    let waited_for = pending.wanted > self.synced_to.load(Ordering::Acquire);
                    let wait = self.time_left(&pending);
                    if waited_for
                        || pending.buf.len() >= WAKE_BYTES
                        || wait.is_zero()
                        || self.wake.wait_for(&mut pending, wait).timed_out()
                    {
                        break;
                    }
                }
            }
            // (Read before the sync: a sync that started before `close` set it may have
            // taken its buffer before the last changes were appended.)
            let stopping = self.stop.load(Ordering::Relaxed);
            self.sync();
            retry_at = self.failed.lock().is_some().then(|| {
                std::time::Instant::now() + self.sync_interval.max(Duration::from_millis(100))
            });
            if stopping {
                // (Callers of `durable` waiting still learn the journal is closed.)
                self.synced.notify_waiters();
                return;
            }
            if let Err(e) = self.rewrite_if_grown() {
                eprintln!(
                    "reverb server: the journal in {} could not be started afresh (it goes on \
                     growing): {e}",
                    self.dir.display()
                );
            }
        }
    }

    /// Makes every change so far durable: logs changed counters, takes what is buffered,
    /// syncs the chunk store (an item's record must not reach the disk before its chunks'
    /// payloads), then writes and syncs the journal. A failure is kept (see
    /// [`Journal::check`]): the file is cut back to its last whole record and the changes
    /// are tried again next time.
    pub(crate) fn sync(&self) {
        let _one = self.sync_held();
        self.sync_now();
    }

    /// Says on stderr (at most once a minute) that a sync took more than half the interval:
    /// the bound on what a crash loses (`sync_interval`) holds only while syncs are faster.
    fn report_if_slow(&self, took: Duration) {
        if took <= self.sync_interval / 2 {
            return;
        }
        let mut reported = self.slow_reported.lock();
        if reported.is_some_and(|at| at.elapsed() < Duration::from_secs(60)) {
            return;
        }
        *reported = Some(std::time::Instant::now());
        eprintln!(
            "reverb server: a sync of the journal in {} took {:.3} s, more than half the sync \
             interval ({:.3} s): changes confirmed meanwhile may take longer than the interval \
             to be durable (a faster disk, or a longer sync_interval, keeps the bound)",
            self.dir.display(),
            took.as_secs_f64(),
            self.sync_interval.as_secs_f64()
        );
    }

    /// The tables attached (those still alive).
    fn attached(&self) -> Vec<Arc<Table>> {
        self.tables
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Holds off other syncs (see `syncing`).
    fn sync_held(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.syncing.lock()
    }

    fn sync_now(&self) {
        let tables = self.attached();
        for table in &tables {
            table.log_counters();
        }
        let (buf, upto, since) = {
            let mut pending = self.pending.lock();
            let since = pending.since.take();
            (std::mem::take(&mut pending.buf), pending.appended, since)
        };
        let started = std::time::Instant::now();
        #[cfg(test)]
        std::thread::sleep(Duration::from_millis(
            self.slow_sync_ms.load(Ordering::Relaxed),
        ));
        let result = self.store.sync();
        #[cfg(test)]
        let result = {
            self.sync_tries.fetch_add(1, Ordering::Relaxed);
            match self.fail_syncs.load(Ordering::Relaxed) {
                true => Err(io::Error::other("failing (test)")),
                false => result,
            }
        };
        let mut state = self.file.lock();
        let at = state.file_bytes;
        let written = result.and_then(|()| match state.file.as_mut() {
            Some(file) if !buf.is_empty() => file.write_all(&buf).and_then(|()| file.sync_data()),
            _ => Ok(()),
        });
        match written {
            Ok(()) => {
                if !buf.is_empty() {
                    let took = started.elapsed().as_nanos() as u64;
                    self.syncs.fetch_add(1, Ordering::Relaxed);
                    self.sync_nanos.fetch_add(took, Ordering::Relaxed);
                    let cost = self.sync_cost.load(Ordering::Relaxed);
                    self.sync_cost
                        .store(took.max(cost - cost / 8), Ordering::Relaxed);
                    self.report_if_slow(Duration::from_nanos(took));
                }
                state.file_bytes += buf.len() as u64;
                self.file_bytes.store(state.file_bytes, Ordering::Relaxed);
                if let Some(carry) = state.carry.as_mut() {
                    carry.extend_from_slice(&buf);
                }
                drop(state);
                *self.failed.lock() = None;
                self.synced_to.store(upto, Ordering::Release);
                self.synced.notify_waiters();
            }
            Err(e) => {
                // (A partial write would leave a torn record before the retried ones.)
                let cut = match state.file.as_mut() {
                    Some(file) => file.set_len(at).and_then(|()| {
                        use std::io::Seek;
                        file.seek(io::SeekFrom::Start(at)).map(|_| ())
                    }),
                    None => Ok(()),
                };
                drop(state);
                let mut pending = self.pending.lock();
                let mut kept = buf;
                kept.extend_from_slice(&pending.buf);
                pending.buf = kept;
                pending.since = since.or(pending.since);
                drop(pending);
                let mut message = format!(
                    "The journal in {} could not be written: {e}",
                    self.dir.display()
                );
                if let Err(cut) = cut {
                    message.push_str(&format!(" (nor cut back: {cut})"));
                }
                *self.failed.lock() = Some((e.kind(), message));
                // (Callers waiting for durability learn of it.)
                self.synced.notify_waiters();
            }
        }
    }

    /// Waits until every change made so far is durable (a server syncing "always" confirms
    /// inserts after this): the writer thread is woken at once, and one sync serves every
    /// caller waiting by then. Fails while the journal cannot be written.
    pub async fn durable(&self) -> io::Result<()> {
        let target = {
            let mut pending = self.pending.lock();
            pending.wanted = pending.wanted.max(pending.appended);
            self.wake.notify_one();
            pending.appended
        };
        loop {
            let synced = self.synced.notified();
            tokio::pin!(synced);
            synced.as_mut().enable();
            if self.synced_to.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            self.check()?;
            if self.stop.load(Ordering::Relaxed) && self.thread.lock().is_none() {
                return Err(io::Error::other(
                    "the journal is closed (its server stopped)",
                ));
            }
            synced.await;
        }
    }

    /// What it holds and has done.
    pub fn stats(&self) -> JournalStats {
        JournalStats {
            bytes: self.file_bytes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            sync_seconds: self.sync_nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    /// Fails (with the error's kind: a full disk is RESOURCE_EXHAUSTED to a client) while the
    /// journal cannot be written.
    pub fn check(&self) -> io::Result<()> {
        match &*self.failed.lock() {
            None => Ok(()),
            Some((kind, message)) => Err(io::Error::new(*kind, message.clone())),
        }
    }

    /// Stops logging (the server is stopping): the tables are detached, and the writer
    /// thread makes a last sync and ends (a failure of it is reported on stderr).
    pub fn close(&self) {
        let tables = self.attached();
        // (Counters logged and tables detached first: no change comes after the last sync.)
        for table in &tables {
            table.log_counters();
            table.set_journal(None);
        }
        self.stop.store(true, Ordering::Relaxed);
        {
            let _pending = self.pending.lock();
            self.wake.notify_all();
        }
        let thread = self.thread.lock().take();
        match thread {
            Some(thread) => {
                let _ = thread.join();
            }
            None => self.sync(),
        }
        self.tables.lock().clear();
        if let Err(e) = self.check() {
            eprintln!("reverb server: the last changes may be lost: {e}");
        }
    }
}

fn snapshot_counters(s: &TableSnapshot) -> Counters {
    let (inserts, samples, deletes) = s.counters;
    [
        inserts,
        samples,
        deletes,
        s.num_deleted_episodes,
        s.num_unique_samples,
    ]
}

/// A writer counting the bytes written.
struct Counted<W>(W, u64);

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.0.write(buf)?;
        self.1 += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

fn write_record(
    out: &mut impl Write,
    kind: u8,
    table: u16,
    fields: &[u8],
    body: &mut Vec<u8>,
) -> io::Result<()> {
    body.clear();
    body.push(kind);
    body.extend_from_slice(&table.to_le_bytes());
    body.extend_from_slice(fields);
    out.write_all(&(body.len() as u32).to_le_bytes())?;
    out.write_all(&crc32fast::hash(body).to_le_bytes())?;
    out.write_all(body)
}

/// A table's contents as replayed.
#[derive(Default)]
struct Replayed {
    /// key -> (insertion order, item (None: its data is gone), priority)
    items: KeyHashMap<(u64, Option<Arc<ItemData>>, f64)>,
    next: u64,
    counters: Counters,
}

/// Whether a whole record (its length within the file, a known kind, its checksum right)
/// starts anywhere in `file` from `from` to `size`. (Past [`SEARCHED`] bytes the answer is
/// yes: that much after a bad record is no torn end.)
fn record_after(file: &File, from: u64, size: u64) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    if size.saturating_sub(from) > SEARCHED {
        return Ok(true);
    }
    let mut rest = vec![0u8; size.saturating_sub(from) as usize];
    file.read_exact_at(&mut rest, from)?;
    for p in 0..rest.len().saturating_sub(10) {
        let len = u32::from_le_bytes(rest[p..p + 4].try_into().expect("4 bytes")) as usize;
        if len < 3 || len > rest.len() - p - 8 || !(TABLES..=COUNTERS).contains(&rest[p + 8]) {
            continue;
        }
        let crc = u32::from_le_bytes(rest[p + 4..p + 8].try_into().expect("4 bytes"));
        if crc32fast::hash(&rest[p + 8..p + 8 + len]) == crc {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Bytes after a bad record searched for a whole one.
const SEARCHED: u64 = 256 << 20;

fn corrupt(path: &Path, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("The journal {} {what}", path.display()),
    )
}

/// Reads the fields of a record's body in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn f64(&mut self) -> Option<f64> {
        Some(f64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

fn replay(path: &Path, store: &Arc<ChunkStore>, recovery: &mut Recovery) -> io::Result<()> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let size = file.metadata()?.len();
    let mut input = io::BufReader::with_capacity(8 << 20, file.try_clone()?);
    let mut names: Vec<String> = Vec::new();
    let mut tables: Vec<Replayed> = Vec::new();
    let mut chunks: KeyHashMap<Option<Arc<Chunk>>> = KeyHashMap::default();
    let mut at = 0u64;
    let mut head = [0u8; 8];
    let mut body = Vec::new();
    while at < size {
        let whole = size - at >= 8 && input.read_exact(&mut head).is_ok();
        let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes")) as u64;
        let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        let fits = whole && at + 8 + len <= size;
        if fits {
            body.resize(len as usize, 0);
            input.read_exact(&mut body)?;
        }
        if !fits || crc32fast::hash(&body) != crc || body.len() < 3 {
            // The end of a write a crash cut short is cut off. A bad record with a whole one
            // after it is damage, not a torn end (a flipped byte, a length gone wrong):
            // cutting there would lose the changes after it, so nothing is changed and
            // opening fails.
            if record_after(&file, at + 1, size)? {
                return Err(corrupt(
                    path,
                    &format!(
                        "is damaged at byte {at} (a record fails its checksum and whole \
                         records follow it); move the directory away to start empty, or cut \
                         the file at that byte to keep what came before"
                    ),
                ));
            }
            recovery.torn_bytes = size - at;
            file.set_len(at)?;
            file.sync_all()?;
            break;
        }
        at += 8 + len;
        let kind = body[0];
        let table = u16::from_le_bytes([body[1], body[2]]) as usize;
        let mut fields = Fields(&body[3..]);
        if kind == TABLES {
            let n = fields
                .u16()
                .ok_or_else(|| corrupt(path, "has a bad table list"))?;
            for _ in 0..n {
                let len = fields
                    .u16()
                    .ok_or_else(|| corrupt(path, "has a bad table list"))?;
                let name = fields
                    .take(len as usize)
                    .ok_or_else(|| corrupt(path, "has a bad table list"))?;
                names.push(String::from_utf8_lossy(name).into_owned());
                tables.push(Replayed::default());
            }
            continue;
        }
        let Some(t) = tables.get_mut(table) else {
            return Err(corrupt(
                path,
                &format!("names table {table}, which it does not list"),
            ));
        };
        let bad = || {
            corrupt(
                path,
                &format!("has a malformed record at byte {}", at - 8 - len),
            )
        };
        match kind {
            INSERT => {
                let priority = fields.f64().ok_or_else(bad)?;
                let n = fields.u32().ok_or_else(bad)? as usize;
                let proto =
                    PrioritizedItem::decode(fields.take(n).ok_or_else(bad)?).map_err(|_| bad())?;
                let count = fields.u32().ok_or_else(bad)?;
                let mut item_chunks = Vec::with_capacity(count as usize);
                let mut missing = false;
                for _ in 0..count {
                    let key = fields.u64().ok_or_else(bad)?;
                    let header: [u8; STORED_HEADER] = fields
                        .take(STORED_HEADER)
                        .ok_or_else(bad)?
                        .try_into()
                        .expect("sized");
                    let kept = fields.take(1).ok_or_else(bad)?[0] == 1;
                    let payload = if kept {
                        let len = fields.u32().ok_or_else(bad)? as usize;
                        Some(fields.take(len).ok_or_else(bad)?)
                    } else {
                        None
                    };
                    // (Chunks are shared by key, as stored, when they agree with the record:
                    // a small payload is in every record, and a writer may have reused a
                    // key for other small data.)
                    let known = chunks.get(&key).and_then(|c| match c {
                        Some(c)
                            if c.header() == header && payload.is_none_or(|p| c.payload() == p) =>
                        {
                            Some(Some(c.clone()))
                        }
                        None if payload.is_none() => Some(None),
                        _ => None,
                    });
                    let chunk = match known {
                        Some(chunk) => chunk,
                        None => {
                            let chunk = store.recovered(key, &header, payload);
                            chunks.entry(key).or_insert_with(|| chunk.clone());
                            chunk
                        }
                    };
                    match chunk {
                        Some(c) => item_chunks.push(c),
                        None => missing = true,
                    }
                }
                if let Some(entry) = t.items.get_mut(&proto.key) {
                    entry.2 = priority;
                    continue;
                }
                t.counters[0] += 1;
                // An item whose data is gone is kept as such: deleted later (its chunks
                // forgotten since), it is an ordinary delete; still there at the end, it is
                // left out.
                let item = if missing {
                    None
                } else {
                    Some(Arc::new(
                        ItemData::from_proto(&proto, item_chunks).map_err(|e| {
                            corrupt(
                                path,
                                &format!("holds item {} that does not fit: {e}", proto.key),
                            )
                        })?,
                    ))
                };
                t.items.insert(proto.key, (t.next, item, priority));
                t.next += 1;
            }
            PRIORITY => {
                let key = fields.u64().ok_or_else(bad)?;
                let priority = fields.f64().ok_or_else(bad)?;
                if let Some(entry) = t.items.get_mut(&key) {
                    entry.2 = priority;
                }
            }
            DELETE => {
                let key = fields.u64().ok_or_else(bad)?;
                if t.items.remove(&key).is_some() {
                    t.counters[2] += 1;
                }
            }
            RESET => {
                t.items.clear();
                t.counters = [0; 5];
            }
            COUNTERS => {
                for c in &mut t.counters {
                    *c = fields.u64().ok_or_else(bad)? as i64;
                }
            }
            _ => {
                return Err(corrupt(
                    path,
                    &format!("has a record of unknown kind {kind}"),
                ))
            }
        }
    }
    for (name, t) in names.into_iter().zip(tables) {
        let held = t.items.len();
        let mut items: Vec<(u64, Arc<ItemData>, f64)> = t
            .items
            .into_values()
            .filter_map(|(seq, item, p)| Some((seq, item?, p)))
            .collect();
        // Left out: counted as deleted.
        let dropped = held - items.len();
        recovery.dropped_items += dropped;
        items.sort_unstable_by_key(|e| e.0);
        let [inserts, samples, deletes, deleted_episodes, unique] = t.counters;
        let deletes = deletes + dropped as i64;
        recovery.tables.insert(
            name,
            TableSnapshot {
                items: items.into_iter().map(|(_, item, p)| (item, p, 0)).collect(),
                counters: (inserts, samples, deletes),
                num_deleted_episodes: deleted_episodes,
                num_unique_samples: unique,
            },
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
