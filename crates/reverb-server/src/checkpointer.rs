//! Checkpoints on disk: `<root>/<UTC timestamp>/checkpoint.rvb`, written under a temporary
//! name (`<root>/.tmp-…`), synced, then published with an atomic rename. A crash mid-write
//! leaves only an ignored temporary directory; the previous checkpoint stays loadable. A
//! server storing chunks on disk links its segments into the checkpoint's `segments/`
//! instead of copying the chunks' data (see [`checkpoint`]).
//! Checkpoints dm-reverb wrote (see [`crate::dm_checkpoint`]) are restored too.

use crate::dm_checkpoint;
use reverb_core::checkpoint;
use reverb_core::{ChunkStore, Table};
use std::fs;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const FILE: &str = checkpoint::FILE_NAME;
const TMP_PREFIX: &str = ".tmp-";

/// Where checkpoints go and how many are kept.
#[derive(Debug)]
pub struct Checkpointer {
    root: PathBuf,
    fallback: Option<PathBuf>,
    keep_latest: usize,
    writing: Mutex<()>,
}

/// What a save did.
#[derive(Debug, Clone)]
pub struct SaveReport {
    /// The published checkpoint directory.
    pub path: PathBuf,
    /// Bytes written.
    pub bytes: u64,
    /// Longest time any table was locked to copy its item handles.
    pub max_table_pause: Duration,
    /// Whole save, including fsync.
    pub elapsed: Duration,
}

impl Checkpointer {
    /// Checkpoints under `root`; `fallback` is loaded when `root` holds none.
    pub fn new(root: impl Into<PathBuf>, fallback: Option<PathBuf>, keep_latest: usize) -> Self {
        Self {
            root: root.into(),
            fallback,
            keep_latest: keep_latest.max(1),
            writing: Mutex::new(()),
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes a checkpoint of `tables` and prunes old ones. Tables keep serving: each is
    /// locked only while its item handles are copied.
    pub fn save(&self, tables: &[Arc<Table>]) -> Result<SaveReport, String> {
        let _one_at_a_time = self.writing.lock().unwrap();
        let started = Instant::now();
        let mut max_table_pause = Duration::ZERO;
        let snapshots: Vec<_> = tables
            .iter()
            .map(|t| {
                let before = Instant::now();
                let s = t.snapshot();
                max_table_pause = max_table_pause.max(before.elapsed());
                s
            })
            .collect();
        fs::create_dir_all(&self.root).map_err(|e| io_err("create", &self.root, e))?;
        let name = timestamp_name();
        let tmp = self.root.join(format!("{TMP_PREFIX}{name}"));
        let path = self.root.join(&name);
        fs::create_dir(&tmp).map_err(|e| io_err("create", &tmp, e))?;
        let file_path = tmp.join(FILE);
        let bytes = (|| -> std::io::Result<u64> {
            let file = fs::File::create(&file_path)?;
            let mut out = BufWriter::with_capacity(8 << 20, EarlyWriteback::new(file));
            let pairs: Vec<(&Table, &_)> = tables
                .iter()
                .map(|t| t.as_ref())
                .zip(snapshots.iter())
                .collect();
            let bytes = checkpoint::write(&mut out, &pairs, Some(&tmp))?;
            out.flush()?;
            out.get_ref().file.sync_all()?;
            // (Its entries, the file and the linked segments, before it is published.)
            fs::File::open(&tmp)?.sync_all()?;
            Ok(bytes)
        })()
        .map_err(|e| {
            // (Nothing half-written stays: its links would keep segments on disk.)
            let _ = fs::remove_dir_all(&tmp);
            io_err("write", &file_path, e)
        })?;
        drop(snapshots);
        fs::rename(&tmp, &path).map_err(|e| {
            let _ = fs::remove_dir_all(&tmp);
            io_err("publish", &path, e)
        })?;
        // (Older checkpoints are pruned only once this one's name is durable.)
        if fs::File::open(&self.root)
            .and_then(|d| d.sync_all())
            .is_ok()
        {
            self.prune();
        }
        Ok(SaveReport {
            path,
            bytes,
            max_table_pause,
            elapsed: started.elapsed(),
        })
    }

    /// Published checkpoints, oldest first: only directories this server names (a UTC
    /// timestamp, see [`is_checkpoint_name`]) holding a checkpoint file. Anything else under
    /// the root (a `backup/` with a checkpoint in it, say) is neither loaded nor pruned.
    pub fn list(&self) -> Vec<PathBuf> {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut dirs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_str().is_some_and(is_checkpoint_name))
            .map(|e| e.path())
            .filter(|p| p.join(FILE).is_file())
            .collect();
        dirs.sort();
        dirs
    }

    fn prune(&self) {
        let dirs = self.list();
        if dirs.len() > self.keep_latest {
            for old in &dirs[..dirs.len() - self.keep_latest] {
                let _ = fs::remove_dir_all(old);
            }
        }
        // Leftovers of our interrupted saves (only temporary directories we name).
        if let Ok(entries) = fs::read_dir(&self.root) {
            for e in entries.filter_map(|e| e.ok()) {
                let ours = e
                    .file_name()
                    .to_str()
                    .is_some_and(|n| n.strip_prefix(TMP_PREFIX).is_some_and(is_checkpoint_name));
                if ours && e.file_type().is_ok_and(|t| t.is_dir()) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
    }

    /// The checkpoint to restore: the latest by the time in its name, ours or a complete one
    /// dm-reverb wrote (a user moving an experiment over points us at dm-reverb's root).
    fn latest(&self) -> Option<PathBuf> {
        let entries = fs::read_dir(&self.root).ok()?;
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                let path = e.path();
                let ours = is_checkpoint_name(&name) && path.join(FILE).is_file();
                if !ours && !dm_checkpoint::is_complete(&path) {
                    return None;
                }
                Some((dm_checkpoint::checkpoint_time(&name)?, path))
            })
            .max()
            .map(|(_, path)| path)
    }

    /// Restores the latest checkpoint under the root (or the fallback when there is none)
    /// into `tables`. Returns the path loaded, or None when there was nothing to load.
    /// A corrupt latest checkpoint falls back to the fallback path when one is set; otherwise
    /// it is an error, and no table is changed.
    /// With `storage`, the restored chunks' payloads go to it.
    pub fn load_latest(
        &self,
        tables: &[Arc<Table>],
        storage: Option<&Arc<ChunkStore>>,
    ) -> Result<Option<PathBuf>, String> {
        let latest = self.latest();
        match (latest, &self.fallback) {
            (None, None) => Ok(None),
            (None, Some(fallback)) => load(fallback, tables, storage).map(Some),
            (Some(path), None) => load(&path, tables, storage).map(Some),
            (Some(path), Some(fallback)) => match load(&path, tables, storage) {
                Ok(p) => Ok(Some(p)),
                Err(first) => load(fallback, tables, storage)
                    .map(Some)
                    .map_err(|second| format!("{first}; the fallback also failed: {second}")),
            },
        }
    }
}

/// Asks the kernel to start writing each 64 MiB to disk as soon as it is written, so the final
/// fsync has little left to do and disk writes overlap with encoding.
struct EarlyWriteback {
    file: fs::File,
    written: u64,
    flushed: u64,
}

impl EarlyWriteback {
    const STEP: u64 = 64 << 20;

    fn new(file: fs::File) -> Self {
        Self {
            file,
            written: 0,
            flushed: 0,
        }
    }
}

impl Write for EarlyWriteback {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.flushed >= Self::STEP {
            #[cfg(target_os = "linux")]
            {
                use std::os::fd::AsRawFd;
                // SAFETY: the descriptor is open for the life of `self.file`; the call only
                // starts asynchronous writeback of a byte range and reads no memory of ours.
                unsafe {
                    libc::sync_file_range(
                        self.file.as_raw_fd(),
                        self.flushed as libc::off64_t,
                        (self.written - self.flushed) as libc::off64_t,
                        libc::SYNC_FILE_RANGE_WRITE,
                    );
                }
            }
            self.flushed = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Loads one checkpoint directory (or file) into `tables`: ours, or one dm-reverb wrote (with
/// `storage`, the chunks' payloads go to it).
pub fn load(
    path: &Path,
    tables: &[Arc<Table>],
    storage: Option<&Arc<ChunkStore>>,
) -> Result<PathBuf, String> {
    if path.is_dir() && !path.join(FILE).exists() && dm_checkpoint::is_dm_checkpoint(path) {
        let failed = |e: &dyn std::fmt::Display| {
            format!(
                "Could not load dm-reverb checkpoint {}: {e}",
                path.display()
            )
        };
        let saved = dm_checkpoint::read(path, storage).map_err(|e| failed(&e))?;
        checkpoint::restore(tables, saved).map_err(|e| failed(&e))?;
        return Ok(path.to_path_buf());
    }
    let file_path = if path.is_dir() {
        path.join(FILE)
    } else {
        path.to_path_buf()
    };
    let file = fs::File::open(&file_path).map_err(|e| io_err("open", &file_path, e))?;
    let mut input = BufReader::with_capacity(8 << 20, file);
    let saved = checkpoint::read(&mut input, file_path.parent(), storage)
        .map_err(|e| format!("Could not load checkpoint {}: {e}", file_path.display()))?;
    checkpoint::restore(tables, saved)
        .map_err(|e| format!("Could not load checkpoint {}: {e}", file_path.display()))?;
    Ok(path.to_path_buf())
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> String {
    format!("Could not {what} {}: {e}", path.display())
}

/// Whether `name` is a checkpoint directory name [`timestamp_name`] makes.
fn is_checkpoint_name(name: &str) -> bool {
    const PATTERN: &[u8] = b"dddd-dd-ddTdd-dd-dd.dddddddddZ";
    name.len() == PATTERN.len()
        && name.bytes().zip(PATTERN).all(|(c, &p)| {
            if p == b'd' {
                c.is_ascii_digit()
            } else {
                c == p
            }
        })
}

/// A sortable, unique UTC timestamp: `2026-11-29T16-05-12.123456789Z`.
fn timestamp_name() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}-{:02}-{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        now.subsec_nanos()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::{civil_from_days, is_checkpoint_name, timestamp_name};

    #[test]
    fn only_our_timestamps_are_checkpoint_names() {
        assert!(is_checkpoint_name(&timestamp_name()));
        assert!(is_checkpoint_name("2026-11-29T16-05-12.123456789Z"));
        for other in [
            "backup",
            "2026-11-29",
            "2026-11-29T16-05-12.12345678Z",
            ".tmp-x",
        ] {
            assert!(!is_checkpoint_name(other), "{other}");
        }
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
