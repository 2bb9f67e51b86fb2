//! Candidate chunk stores for tables larger than RAM (issue 43), on the replay's workload:
//! chunks of one size appended under increasing keys, the oldest deleted as new ones come
//! (a FIFO table at its max size), random reads of live chunks in between (sampling), a sync
//! every `--sync-ms` (the durability interval). Reports write and read rates, the bytes on
//! disk against the live bytes, and the process's peak resident memory.
//!
//!     cargo run --release --manifest-path bench/storage/Cargo.toml -- \
//!         --engine fjall|redb|log --dir /tmp/store [--chunk-kb 8] [--live-mb 2048]
//!         [--churn-mb 4096] [--reads-per-write 4] [--cache-mb 64] [--sync-ms 1000]
//!         [--remover fifo|uniform]
//!
//! Engines: `fjall` (an LSM tree with key-value separation: values in blob files, garbage
//! collected), `redb` (a copy-on-write B-tree in one file), `log` (the hand-written segment
//! log the server uses, `reverb_core::segment_log`: chunks appended to 64 MiB segment files,
//! an in-memory index, a segment unlinked when nothing in it is live, the emptiest compacted
//! when the segments hold 1.5x the live bytes). `--remover uniform` deletes a random chunk
//! instead of the oldest.
//! Each chunk read is checked (its first bytes are its key).

use rand::{Rng, SeedableRng};
use redb::{ReadableDatabase, ReadableTable};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A chunk store: what the server would need of one.
trait Store {
    fn put(&mut self, key: u64, value: &[u8]);
    fn delete(&mut self, key: u64);
    fn get(&mut self, key: u64) -> Option<Vec<u8>>;
    /// Makes everything put and deleted so far durable.
    fn sync(&mut self);
    /// Bytes the store copied to reclaim space, when it says.
    fn copied(&self) -> Option<u64> {
        None
    }
}

struct Fjall {
    db: fjall::Database,
    chunks: fjall::Keyspace,
}

impl Fjall {
    fn open(dir: &Path, cache: u64) -> Self {
        let db = fjall::Database::builder(dir)
            .cache_size(cache)
            .open()
            .expect("open fjall");
        let chunks = db
            .keyspace("chunks", || {
                fjall::KeyspaceCreateOptions::default()
                    .with_kv_separation(Some(fjall::KvSeparationOptions::default()))
            })
            .expect("keyspace");
        Self { db, chunks }
    }
}

impl Store for Fjall {
    fn put(&mut self, key: u64, value: &[u8]) {
        self.chunks
            .insert(key.to_be_bytes(), value)
            .expect("insert");
    }
    fn delete(&mut self, key: u64) {
        self.chunks.remove(key.to_be_bytes()).expect("remove");
    }
    fn get(&mut self, key: u64) -> Option<Vec<u8>> {
        let value = self.chunks.get(key.to_be_bytes()).expect("get");
        value.map(|v| v.to_vec())
    }
    fn sync(&mut self) {
        self.db
            .persist(fjall::PersistMode::SyncData)
            .expect("persist");
    }
}

const REDB_TABLE: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("chunks");

struct Redb {
    db: redb::Database,
    /// Puts and deletes not yet committed (committed in one transaction per batch).
    pending: Vec<(u64, Option<Vec<u8>>)>,
}

impl Redb {
    fn open(dir: &Path, cache: u64) -> Self {
        std::fs::create_dir_all(dir).expect("dir");
        let db = redb::Database::builder()
            .set_cache_size(cache as usize)
            .create(dir.join("chunks.redb"))
            .expect("open redb");
        Self {
            db,
            pending: Vec::new(),
        }
    }
    fn commit(&mut self, durable: bool) {
        let mut tx = self.db.begin_write().expect("begin");
        if !durable {
            tx.set_durability(redb::Durability::None)
                .expect("durability");
        }
        {
            let mut table = tx.open_table(REDB_TABLE).expect("table");
            for (key, value) in self.pending.drain(..) {
                match value {
                    Some(v) => {
                        table.insert(key, v.as_slice()).expect("insert");
                    }
                    None => {
                        table.remove(key).expect("remove");
                    }
                }
            }
        }
        tx.commit().expect("commit");
    }
}

impl Store for Redb {
    fn put(&mut self, key: u64, value: &[u8]) {
        self.pending.push((key, Some(value.to_vec())));
        if self.pending.len() >= 64 {
            self.commit(false);
        }
    }
    fn delete(&mut self, key: u64) {
        self.pending.push((key, None));
    }
    fn get(&mut self, key: u64) -> Option<Vec<u8>> {
        if let Some((_, v)) = self.pending.iter().rev().find(|(k, _)| *k == key) {
            return v.clone();
        }
        let tx = self.db.begin_read().expect("read");
        let table = tx.open_table(REDB_TABLE).expect("table");
        let value = table.get(key).expect("get");
        value.map(|v| v.value().to_vec())
    }
    fn sync(&mut self) {
        self.commit(true);
    }
}

/// The segment log the server uses (`reverb_core::segment_log`), 64 MiB segments.
struct Log(reverb_core::segment_log::SegmentLog);

impl Log {
    fn open(dir: &Path) -> Self {
        let (log, _) = reverb_core::segment_log::SegmentLog::open(dir, 64 << 20).expect("open");
        Self(log)
    }
}

impl Store for Log {
    fn put(&mut self, key: u64, value: &[u8]) {
        self.0.put(key, value).expect("put");
    }
    fn delete(&mut self, key: u64) {
        self.0.delete(key).expect("delete");
    }
    fn get(&mut self, key: u64) -> Option<Vec<u8>> {
        self.0.get(key).expect("get")
    }
    fn sync(&mut self) {
        self.0.sync().expect("sync");
    }
    fn copied(&self) -> Option<u64> {
        Some(self.0.copied())
    }
}

struct Args {
    engine: String,
    dir: PathBuf,
    chunk: usize,
    live: u64,
    churn: u64,
    reads_per_write: u32,
    cache: u64,
    sync: Duration,
    /// Which chunk goes when a new one comes: the oldest ("fifo") or a random one.
    remover: String,
}

fn args() -> Args {
    let mut a = Args {
        engine: "log".into(),
        dir: "/tmp/reverb-storage-bench".into(),
        chunk: 8 << 10,
        live: 2048 << 20,
        churn: 4096 << 20,
        reads_per_write: 4,
        cache: 64 << 20,
        sync: Duration::from_millis(1000),
        remover: "fifo".into(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        let number = || value.parse::<u64>().expect("a number");
        match pair[0].as_str() {
            "--engine" => a.engine = value.clone(),
            "--dir" => a.dir = value.clone().into(),
            "--chunk-kb" => a.chunk = number() as usize * 1024,
            "--live-mb" => a.live = number() << 20,
            "--churn-mb" => a.churn = number() << 20,
            "--reads-per-write" => a.reads_per_write = number() as u32,
            "--cache-mb" => a.cache = number() << 20,
            "--sync-ms" => a.sync = Duration::from_millis(number()),
            "--remover" => a.remover = value.clone(),
            _ => {
                eprintln!(
                    "{}",
                    include_str!("main.rs")
                        .lines()
                        .take(16)
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                std::process::exit(2);
            }
        }
    }
    a
}

/// A chunk of incompressible bytes whose first 8 are its key.
fn chunk(rng: &mut impl Rng, key: u64, size: usize) -> Vec<u8> {
    let mut out = vec![0u8; size];
    rng.fill(&mut out[..]);
    out[..8].copy_from_slice(&key.to_le_bytes());
    out
}

fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let meta = entry.metadata().expect("meta");
        total += if meta.is_dir() {
            disk_bytes(&entry.path())
        } else {
            // Allocated blocks, not the apparent length.
            std::os::unix::fs::MetadataExt::blocks(&meta) * 512
        };
    }
    total
}

fn peak_rss_mb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// Drops the page cache (as root), so reads come from the disk; false if not allowed.
fn drop_caches() -> bool {
    let _ = std::process::Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

fn main() {
    let a = args();
    let _ = std::fs::remove_dir_all(&a.dir);
    let mut store: Box<dyn Store> = match a.engine.as_str() {
        "fjall" => Box::new(Fjall::open(&a.dir, a.cache)),
        "redb" => Box::new(Redb::open(&a.dir, a.cache)),
        "log" => Box::new(Log::open(&a.dir)),
        other => panic!("unknown engine {other}"),
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let live = (a.live / a.chunk as u64).max(1);
    let churn = a.churn / a.chunk as u64;
    let mb = |n: u64| (n * a.chunk as u64) as f64 / (1 << 20) as f64;

    // Fill to the live size.
    let start = Instant::now();
    let mut synced = Instant::now();
    for key in 0..live {
        store.put(key, &chunk(&mut rng, key, a.chunk));
        if synced.elapsed() >= a.sync {
            store.sync();
            synced = Instant::now();
        }
    }
    store.sync();
    let fill = start.elapsed().as_secs_f64();

    // Churn (a new chunk, one deleted: the oldest, or a random one) with sampling reads.
    // `slots` holds the live keys: FIFO replaces them in turn, the random remover anywhere.
    let mut slots: Vec<u64> = (0..live).collect();
    let fifo = match a.remover.as_str() {
        "fifo" => true,
        "uniform" => false,
        other => panic!("unknown remover {other}"),
    };
    let start = Instant::now();
    let (mut reads, mut read_time) = (0u64, Duration::ZERO);
    for key in live..live + churn {
        store.put(key, &chunk(&mut rng, key, a.chunk));
        let slot = if fifo {
            (key % live) as usize
        } else {
            rng.random_range(0..slots.len())
        };
        store.delete(std::mem::replace(&mut slots[slot], key));
        for _ in 0..a.reads_per_write {
            let k = slots[rng.random_range(0..slots.len())];
            let t = Instant::now();
            let v = store.get(k).unwrap_or_else(|| panic!("chunk {k} missing"));
            read_time += t.elapsed();
            assert_eq!(&v[..8], &k.to_le_bytes(), "chunk {k} has another's bytes");
            reads += 1;
        }
        if synced.elapsed() >= a.sync {
            store.sync();
            synced = Instant::now();
        }
    }
    store.sync();
    let churned = start.elapsed().as_secs_f64();
    let on_disk = disk_bytes(&a.dir);

    // Cold random reads (page cache dropped), for 10 s.
    let cold = drop_caches();
    let start = Instant::now();
    let mut cold_reads = 0u64;
    while start.elapsed() < Duration::from_secs(10) {
        let k = slots[rng.random_range(0..slots.len())];
        let v = store.get(k).expect("live chunk");
        assert_eq!(&v[..8], &k.to_le_bytes());
        cold_reads += 1;
    }
    let cold_rate = cold_reads as f64 / start.elapsed().as_secs_f64();

    println!(
        "{} ({} remover): chunks {} KiB, live {:.0} MiB | fill {:.0} MB/s | churn: writes {:.0} MB/s \
         ({:.0} chunks/s) with {} reads each, reads {:.0}/s ({:.1} us each) | disk {:.0} MiB \
         = {:.2}x live{} | {} random reads {:.0}/s | peak RSS {} MiB",
        a.engine,
        a.remover,
        a.chunk >> 10,
        mb(live),
        mb(live) / fill,
        mb(churn) / churned,
        churn as f64 / churned,
        a.reads_per_write,
        reads as f64 / churned,
        read_time.as_secs_f64() * 1e6 / reads.max(1) as f64,
        on_disk as f64 / (1 << 20) as f64,
        on_disk as f64 / (live * a.chunk as u64) as f64,
        store.copied().map_or(String::new(), |b| format!(
            ", compaction copied {:.0} MiB",
            b as f64 / (1 << 20) as f64
        )),
        if cold {
            "cold"
        } else {
            "warm (page cache not dropped)"
        },
        cold_rate,
        peak_rss_mb(),
    );
}
