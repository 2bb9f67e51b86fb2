//! Chunk payloads on disk (issue 43's store, chosen by `bench/storage`): a log of segment
//! files in one directory. Each chunk is appended as a record `[MAGIC u32][key u64][len u32]
//! [crc32 u32][payload]` (the checksum covers key, length and payload) to the active segment;
//! a segment is sealed at its size bound and a new one started. An in-memory index says
//! where each live chunk is. Deleting a chunk only forgets it: a sealed segment is unlinked
//! when nothing in it is live (under FIFO deletes that is all it takes), and once the
//! segments hold more than [`MAX_AMPLIFICATION`] times the live bytes (random deletes), the
//! emptiest sealed segment is compacted: its live chunks appended anew, then it is unlinked.
//! Deletes are not logged: after a restart, the owner (which logs its items elsewhere)
//! deletes the chunks no item references.
//!
//! Opening scans every segment, checking every record: a record cut short at the end of the
//! newest segment (a write a crash interrupted) is cut off; any other record that fails its
//! checksum is reported and left out; every read checks the checksum again. A directory is
//! held by one open log at a time (an exclusive lock on its `LOCK` file).

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use reverb_proto::KeyHashMap;

/// The first bytes of every record.
const MAGIC: u32 = 0x5256_4331; // "RVC1"
/// Bytes of a record's header.
const HEADER: u64 = 20;
/// Segment bytes over live bytes past which compaction runs (beyond two segments' slack).
pub const MAX_AMPLIFICATION: f64 = 1.5;

/// Where a chunk's record is: its segment (the file [`segment_name`] names), the offset of
/// the record's header in it, and the payload's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The segment's id.
    pub segment: u64,
    /// Offset of the record's header.
    pub at: u64,
    /// Bytes of the record's payload.
    pub len: u32,
}

struct Segment {
    file: File,
    /// Bytes written (the record ends).
    len: u64,
    /// Bytes of live records.
    live: u64,
    /// The keys written here, in order (some deleted or moved since).
    keys: Vec<u64>,
}

impl Segment {
    /// A segment of `file` with nothing counted in it yet.
    fn empty(file: File) -> Self {
        Self {
            file,
            len: 0,
            live: 0,
            keys: Vec::new(),
        }
    }
}

/// What opening a log found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Chunks found whole.
    pub chunks: usize,
    /// Bytes cut off the end of the newest segment (a write a crash interrupted).
    pub torn_bytes: u64,
    /// Records that failed their checksum (left out), as (segment, offset).
    pub corrupt: Vec<(u64, u64)>,
}

/// The log of one directory (see the module's documentation).
pub struct SegmentLog {
    dir: PathBuf,
    /// Held for the log's life: the directory's exclusive lock.
    _lock: File,
    segments: BTreeMap<u64, Segment>,
    active: u64,
    index: KeyHashMap<Place>,
    segment_bytes: u64,
    /// Bytes the segments hold, and bytes of live records in them.
    total: u64,
    live: u64,
    /// Bytes compaction copied, in all.
    copied: u64,
}

/// The file name of segment `id`.
pub fn segment_name(id: u64) -> String {
    format!("{id:016x}.seg")
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(segment_name(id))
}

/// Chunk `key`'s payload, read from its record at `place` in `file` (the segment at `path`,
/// named in errors): its first `head.len()` bytes into `head`, the rest into the buffer
/// `buffer` gives for their length (one read: no copy). The record's framing, key, length
/// and checksum are checked.
pub fn read_record<B: AsMut<[u8]>>(
    file: &File,
    path: &Path,
    key: u64,
    place: Place,
    head: &mut [u8],
    buffer: impl FnOnce(usize) -> B,
) -> io::Result<B> {
    let Some(rest) = (place.len as usize).checked_sub(head.len()) else {
        return Err(corrupt(located(
            key,
            path,
            place,
            "shorter than its header",
        )));
    };
    let mut payload = buffer(rest);
    let mut frame = [0u8; HEADER as usize];
    read_parts_at(file, &mut [&mut frame, head, payload.as_mut()], place.at)
        .map_err(|e| io::Error::new(e.kind(), located(key, path, place, &e.to_string())))?;
    let field = |at: usize| u32::from_le_bytes(frame[at..at + 4].try_into().expect("4 bytes"));
    let framed = field(0) == MAGIC
        && frame[4..12] == key.to_le_bytes()
        && field(12) == place.len
        && record_crc(key, &[head, payload.as_mut()]) == field(16);
    if !framed {
        return Err(corrupt(located(key, path, place, "fails its checksum")));
    }
    Ok(payload)
}

/// `what` about chunk `key`'s record at `place` in the segment at `path`.
fn located(key: u64, path: &Path, place: Place, what: &str) -> String {
    format!("chunk {key} in {} at {}: {what}", path.display(), place.at)
}

/// Fills `parts` end to end from `file` at `offset` (a `preadv`, again after a short read).
fn read_parts_at(file: &File, parts: &mut [&mut [u8]], offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut slices: Vec<io::IoSliceMut> =
        parts.iter_mut().map(|p| io::IoSliceMut::new(p)).collect();
    let mut slices = &mut slices[..];
    let mut at = offset;
    while !slices.is_empty() {
        // (A record is read in three parts: far below any limit on their number.)
        let count = slices.len() as libc::c_int;
        let offset = libc::off_t::try_from(at)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past off_t"))?;
        // SAFETY: `IoSliceMut` is ABI-compatible with `iovec` on Unix (std documents it);
        // each points into a buffer of `parts`, borrowed exclusively for this call, and
        // preadv writes at most their lengths; the descriptor is open for `file`'s life.
        let read = unsafe {
            libc::preadv(
                file.as_raw_fd(),
                slices.as_ptr().cast::<libc::iovec>(),
                count,
                offset,
            )
        };
        match read {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file ends first",
                ))
            }
            n if n > 0 => {
                at += n as u64;
                io::IoSliceMut::advance_slices(&mut slices, n as usize);
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// The checksum of a record of `key` whose payload is `parts` end to end.
fn record_crc(key: u64, parts: &[&[u8]]) -> u32 {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut crc = crc32fast::Hasher::new();
    crc.update(&key.to_le_bytes());
    crc.update(&(len as u32).to_le_bytes());
    parts.iter().for_each(|p| crc.update(p));
    crc.finalize()
}

fn corrupt(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl SegmentLog {
    /// Opens (or creates) the log in `dir`, recovering what its segments hold; segments are
    /// sealed at `segment_bytes`. Fails if another log holds the directory.
    pub fn open(dir: &Path, segment_bytes: u64) -> io::Result<(Self, Recovered)> {
        fs::create_dir_all(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))?;
        lock.try_lock().map_err(|_| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("{} is held by another server", dir.display()),
            )
        })?;
        let mut ids: Vec<u64> = fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                u64::from_str_radix(name.strip_suffix(".seg")?, 16).ok()
            })
            .collect();
        ids.sort_unstable();
        let mut log = Self {
            dir: dir.to_path_buf(),
            _lock: lock,
            segments: BTreeMap::new(),
            active: 0,
            index: KeyHashMap::default(),
            segment_bytes: segment_bytes.max(HEADER + 1),
            total: 0,
            live: 0,
            copied: 0,
        };
        let mut found = Recovered::default();
        let newest = ids.last().copied();
        for id in ids {
            log.scan(id, Some(id) == newest, &mut found)?;
        }
        found.chunks = log.index.len();
        match newest {
            Some(id) => log.active = id,
            None => log.start_segment(0)?,
        }
        // Segments whose chunks were all copied elsewhere before a crash stopped their
        // unlinking, or deleted before it.
        let sealed: Vec<u64> = log
            .segments
            .keys()
            .copied()
            .filter(|&i| i != log.active)
            .collect();
        for id in sealed {
            log.reclaim(id)?;
        }
        Ok((log, found))
    }

    /// Reads segment `id` whole, indexing its records (a later record of a key wins).
    fn scan(&mut self, id: u64, newest: bool, found: &mut Recovered) -> io::Result<()> {
        let path = segment_path(&self.dir, id);
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let size = file.metadata()?.len();
        let mut input = io::BufReader::with_capacity(1 << 20, file.try_clone()?);
        self.segments.insert(id, Segment::empty(file));
        let mut at = 0u64;
        let mut header = [0u8; HEADER as usize];
        let mut payload = Vec::new();
        while at < size {
            let whole = size - at >= HEADER && input.read_exact(&mut header).is_ok();
            let (magic, key, len, crc) = (
                u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")),
                u64::from_le_bytes(header[4..12].try_into().expect("8 bytes")),
                u32::from_le_bytes(header[12..16].try_into().expect("4 bytes")),
                u32::from_le_bytes(header[16..20].try_into().expect("4 bytes")),
            );
            let fits = whole && magic == MAGIC && at + HEADER + u64::from(len) <= size;
            if fits {
                payload.resize(len as usize, 0);
                input.read_exact(&mut payload)?;
            }
            if !fits || record_crc(key, &[&payload]) != crc {
                if newest {
                    // A write a crash cut short (or never finished): cut it off.
                    found.torn_bytes += size - at;
                    let segment = &self.segments[&id];
                    segment.file.set_len(at)?;
                    segment.file.sync_all()?;
                } else {
                    // Inside a sealed segment: nothing after it can be trusted to be framed.
                    found.corrupt.push((id, at));
                }
                break;
            }
            let place = Place {
                segment: id,
                at,
                len,
            };
            if let Some(old) = self.index.insert(key, place) {
                self.forget(old);
            }
            let segment = self.segments.get_mut(&id).expect("inserted above");
            segment.live += HEADER + u64::from(len);
            segment.keys.push(key);
            self.live += HEADER + u64::from(len);
            at += HEADER + u64::from(len);
        }
        self.segments.get_mut(&id).expect("inserted above").len = at;
        self.total += at;
        Ok(())
    }

    fn start_segment(&mut self, id: u64) -> io::Result<()> {
        let path = segment_path(&self.dir, id);
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)?;
        // The new name must survive a crash too. (If it cannot be made to, the file goes:
        // left, it would refuse the next try to start this segment.)
        if let Err(e) = File::open(&self.dir).and_then(|d| d.sync_all()) {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        self.segments.insert(id, Segment::empty(file));
        self.active = id;
        Ok(())
    }

    /// Appends chunk `key` (replacing an older one under that key). On an error (a full
    /// disk, say) nothing of it stays: the segment is cut back to where it was.
    pub fn put(&mut self, key: u64, payload: &[u8]) -> io::Result<()> {
        self.put_parts(key, &[payload])
    }

    /// [`SegmentLog::put`] of the payload `parts` make end to end (written as one record,
    /// copied once).
    pub fn put_parts(&mut self, key: u64, parts: &[&[u8]]) -> io::Result<()> {
        let place = self.append(key, parts)?;
        if let Some(old) = self.index.insert(key, place) {
            self.forget(old);
            self.reclaim(old.segment)?;
        }
        Ok(())
    }

    /// Writes a record of `key` at the end of the active segment (sealing it first when
    /// full); the index is the caller's.
    fn append(&mut self, key: u64, parts: &[&[u8]]) -> io::Result<Place> {
        let len = u32::try_from(parts.iter().map(|p| p.len()).sum::<usize>())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "chunk over 4 GiB"))?;
        if self.segments[&self.active].len >= self.segment_bytes {
            self.seal()?;
        }
        let id = self.active;
        let segment = self.segments.get_mut(&id).expect("the active segment");
        let mut record = Vec::with_capacity(HEADER as usize + len as usize);
        record.extend_from_slice(&MAGIC.to_le_bytes());
        record.extend_from_slice(&key.to_le_bytes());
        record.extend_from_slice(&len.to_le_bytes());
        record.extend_from_slice(&record_crc(key, parts).to_le_bytes());
        parts.iter().for_each(|p| record.extend_from_slice(p));
        let at = segment.len;
        if let Err(e) = segment.file.write_all_at(&record, at) {
            let _ = segment.file.set_len(at);
            return Err(e);
        }
        segment.len += record.len() as u64;
        segment.live += record.len() as u64;
        segment.keys.push(key);
        self.total += record.len() as u64;
        self.live += record.len() as u64;
        Ok(Place {
            segment: id,
            at,
            len,
        })
    }

    /// Chunk `key`'s payload (checksum checked), or None without one.
    pub fn get(&self, key: u64) -> io::Result<Option<Vec<u8>>> {
        self.get_into(key, &mut [], |len| vec![0u8; len])
    }

    /// [`SegmentLog::get`] with the payload's first `head.len()` bytes read into `head` and
    /// the rest into the buffer `buffer` gives for their length (see [`read_record`]).
    pub fn get_into<B: AsMut<[u8]>>(
        &self,
        key: u64,
        head: &mut [u8],
        buffer: impl FnOnce(usize) -> B,
    ) -> io::Result<Option<B>> {
        let Some(&place) = self.index.get(&key) else {
            return Ok(None);
        };
        let path = segment_path(&self.dir, place.segment);
        let file = &self.segments[&place.segment].file;
        read_record(file, &path, key, place, head, buffer).map(Some)
    }

    /// Seals the active segment (synced, never written again) and starts the next.
    pub fn seal(&mut self) -> io::Result<()> {
        let sealed = self.seal_unreclaimed()?;
        self.reclaim(sealed)
    }

    /// [`SegmentLog::seal`] without reclaiming the sealed segment (which may compact it);
    /// returns its id.
    fn seal_unreclaimed(&mut self) -> io::Result<u64> {
        let sealed = self.active;
        self.segments[&sealed].file.sync_data()?;
        self.start_segment(sealed + 1)?;
        Ok(sealed)
    }

    /// [`SegmentLog::link`] of a chunk in the active segment: the segment is sealed, the
    /// chunk linked, and only then the sealed segment reclaimed (compacting it first would
    /// move the chunk into the new active segment).
    pub fn seal_and_link(
        &mut self,
        key: u64,
        into: &Path,
        linked: &mut std::collections::HashSet<u64>,
    ) -> io::Result<Option<Place>> {
        let sealed = self.seal_unreclaimed()?;
        let place = self.link(key, into, linked);
        self.reclaim(sealed)?;
        place
    }

    /// Where chunk `key`'s record is, if it is held.
    pub fn place(&self, key: u64) -> Option<Place> {
        self.index.get(&key).copied()
    }

    /// The segment appends go to.
    pub fn active(&self) -> u64 {
        self.active
    }

    /// Hard-links the sealed segment holding chunk `key` into the directory `into` under its
    /// own name (once: `linked` holds the segments linked so far), so that the record stays
    /// readable there, unchanged, whatever the log does next (a sealed segment is never
    /// written again; compacted or dead, it only loses its name here). Returns where the
    /// record is; None when the chunk is not held. Fails where `into` is on another
    /// filesystem, and for a chunk in the active segment ([`SegmentLog::seal`] it first).
    pub fn link(
        &self,
        key: u64,
        into: &Path,
        linked: &mut std::collections::HashSet<u64>,
    ) -> io::Result<Option<Place>> {
        let Some(&place) = self.index.get(&key) else {
            return Ok(None);
        };
        if place.segment == self.active {
            return Err(io::Error::other(
                "the active segment is not linked: seal it first",
            ));
        }
        if !linked.contains(&place.segment) {
            fs::hard_link(
                segment_path(&self.dir, place.segment),
                into.join(segment_name(place.segment)),
            )?;
            linked.insert(place.segment);
        }
        Ok(Some(place))
    }

    /// Forgets chunk `key` (true if there was one); its space comes back as its segment dies
    /// or is compacted.
    pub fn delete(&mut self, key: u64) -> io::Result<bool> {
        let Some(place) = self.index.remove(&key) else {
            return Ok(false);
        };
        self.forget(place);
        self.reclaim(place.segment)?;
        Ok(true)
    }

    /// Keeps only the chunks `keep` says yes to (after a restart: those items reference).
    pub fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) -> io::Result<()> {
        let gone: Vec<u64> = self.index.keys().copied().filter(|&k| !keep(k)).collect();
        for key in gone {
            self.delete(key)?;
        }
        Ok(())
    }

    /// Makes every chunk put so far durable.
    pub fn sync(&self) -> io::Result<()> {
        self.segments[&self.active].file.sync_data()
    }

    /// A handle of the active segment: syncing it (outside whatever guards the log) makes
    /// every chunk put so far durable, sealed segments having been synced when sealed.
    pub fn active_file(&self) -> io::Result<File> {
        self.segments[&self.active].file.try_clone()
    }

    fn forget(&mut self, place: Place) {
        if let Some(segment) = self.segments.get_mut(&place.segment) {
            segment.live -= HEADER + u64::from(place.len);
            self.live -= HEADER + u64::from(place.len);
        }
    }

    /// Unlinks sealed segment `id` once nothing in it is live; then compacts while the
    /// segments hold too much more than the live bytes.
    fn reclaim(&mut self, id: u64) -> io::Result<()> {
        self.unlink_if_dead(id)?;
        let slack = 2 * self.segment_bytes;
        while self.total > slack + (self.live as f64 * MAX_AMPLIFICATION) as u64 {
            // The sealed segment with the least live in it (ties: the oldest).
            let emptiest = self
                .segments
                .iter()
                .filter(|(&i, s)| i != self.active && s.len > 0)
                .min_by(|(_, a), (_, b)| (a.live * b.len).cmp(&(b.live * a.len)))
                .map(|(&i, _)| i);
            let Some(victim) = emptiest else { break };
            let segment = &self.segments[&victim];
            // (Copying a mostly live segment gains nothing: the dead bytes are elsewhere,
            // in the active segment.)
            if segment.live * 10 > segment.len * 9 {
                break;
            }
            let before = self.total;
            self.compact(victim)?;
            if self.total >= before {
                break;
            }
        }
        Ok(())
    }

    fn unlink_if_dead(&mut self, id: u64) -> io::Result<()> {
        if id != self.active && self.segments.get(&id).is_some_and(|s| s.live == 0) {
            let segment = self.segments.remove(&id).expect("present");
            self.total -= segment.len;
            fs::remove_file(segment_path(&self.dir, id))?;
        }
        Ok(())
    }

    /// Appends sealed segment `id`'s live chunks anew, then unlinks it.
    fn compact(&mut self, id: u64) -> io::Result<()> {
        let keys = std::mem::take(&mut self.segments.get_mut(&id).expect("present").keys);
        for key in keys {
            if self.index.get(&key).is_some_and(|p| p.segment == id) {
                let payload = self.get(key)?.expect("indexed");
                self.copied += payload.len() as u64;
                let place = self.append(key, &[&payload])?;
                let old = self.index.insert(key, place).expect("indexed");
                self.forget(old);
            }
        }
        // (The copies must be durable before the original goes.)
        self.sync()?;
        self.unlink_if_dead(id)
    }

    /// Asks the kernel to start reading chunk `key`'s record, if held: the reads of a batch's
    /// records then overlap instead of waiting one after another.
    pub fn will_need(&self, key: u64) {
        #[cfg(target_os = "linux")]
        self.advise_will_need(key);
        #[cfg(not(target_os = "linux"))]
        let _ = key;
    }

    #[cfg(target_os = "linux")]
    fn advise_will_need(&self, key: u64) {
        use std::os::fd::AsRawFd;
        let Some(&place) = self.index.get(&key) else {
            return;
        };
        let file = &self.segments[&place.segment].file;
        // SAFETY: posix_fadvise takes an open descriptor (the segment's file, alive for this
        // borrow) and a byte range, and touches no memory of ours; an error only means the
        // kernel reads nothing ahead.
        unsafe {
            libc::posix_fadvise(
                file.as_raw_fd(),
                place.at as libc::off_t,
                (HEADER + u64::from(place.len)) as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }

    /// Whether chunk `key` is held with exactly the payload `parts` make (its length and checksum, read
    /// from its record's header, agree).
    pub fn holds(&self, key: u64, parts: &[&[u8]]) -> io::Result<bool> {
        let Some(&place) = self.index.get(&key) else {
            return Ok(false);
        };
        if place.len as usize != parts.iter().map(|p| p.len()).sum::<usize>() {
            return Ok(false);
        }
        let mut header = [0u8; HEADER as usize];
        self.segments[&place.segment]
            .file
            .read_exact_at(&mut header, place.at)?;
        let crc = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes"));
        Ok(crc == record_crc(key, parts))
    }

    /// The length of chunk `key`'s payload, if it is held.
    pub fn payload_len(&self, key: u64) -> Option<u32> {
        self.index.get(&key).map(|p| p.len)
    }

    /// Whether chunk `key` is held.
    pub fn contains(&self, key: u64) -> bool {
        self.index.contains_key(&key)
    }

    /// Chunks held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether no chunk is held.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The keys of the chunks held, in no order.
    pub fn keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.index.keys().copied()
    }

    /// Bytes the segments take, and bytes of live records in them.
    pub fn bytes(&self) -> (u64, u64) {
        (self.total, self.live)
    }

    /// Bytes compaction copied since the log was opened.
    pub fn copied(&self) -> u64 {
        self.copied
    }
}

#[cfg(test)]
#[path = "segment_log_tests.rs"]
mod tests;
