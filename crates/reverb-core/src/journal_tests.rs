//! The journal: tables back after a restart with their items, data, priorities and counters;
//! a torn tail; a chunk lost from the store.

use super::*;
use crate::{InsertOutcome, RateLimiterConfig, SelectorKind, TableConfig};
use rand::{Rng, SeedableRng};
use reverb_proto::{flat_trajectory, ChunkData, FlatTrajectory, SequenceRange};

use crate::test_dir::Dir;

fn table(name: &str, max_size: i64) -> Arc<Table> {
    Arc::new(
        Table::new(TableConfig {
            name: name.into(),
            sampler: SelectorKind::Prioritized {
                priority_exponent: 1.0,
            },
            remover: SelectorKind::Fifo,
            max_size,
            max_times_sampled: 0,
            rate_limiter: RateLimiterConfig {
                samples_per_insert: 1.0,
                min_size_to_sample: 1,
                min_diff: f64::MIN,
                max_diff: f64::MAX,
            },
            signature: None,
        })
        .unwrap(),
    )
}

fn payload(key: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(key);
    let mut out = vec![0u8; len];
    rng.fill(&mut out[..]);
    out
}

/// Item `key` over a large chunk (on disk) and a small one (in memory).
fn item(store: &Arc<ChunkStore>, key: u64) -> ItemData {
    let chunk = |k: u64, len: usize| {
        store
            .store(ChunkData {
                chunk_key: k,
                sequence_range: Some(SequenceRange {
                    episode_id: key,
                    start: 0,
                    end: 0,
                    sparse: false,
                }),
                data: payload(k, len).into(),
                data_tensors_len: 1,
                data_uncompressed_size: len as i64,
                ..Default::default()
            })
            .unwrap()
    };
    let chunks = vec![chunk(key * 10, 3000), chunk(key * 10 + 1, 20)];
    let trajectory = FlatTrajectory {
        columns: chunks
            .iter()
            .flat_map(|c| one_column(c.key()).columns)
            .collect(),
    };
    ItemData::new(key, &trajectory, chunks).unwrap()
}

/// A trajectory of one column: row 0 of chunk `key`.
fn one_column(key: u64) -> FlatTrajectory {
    FlatTrajectory {
        columns: vec![flat_trajectory::Column {
            chunk_slices: vec![flat_trajectory::ChunkSlice {
                chunk_key: key,
                offset: 0,
                length: 1,
                index: 0,
            }],
            squeeze: false,
        }],
    }
}

/// The directory's journal file.
fn journal_file(dir: &Path) -> PathBuf {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".log"))
        .unwrap()
}

/// Opens the directory: store, journal, and the tables restored from it and attached.
fn open(dir: &Path, tables: &[Arc<Table>]) -> (Arc<ChunkStore>, Arc<Journal>, Recovery) {
    let store = ChunkStore::open(dir, 1 << 20).unwrap();
    let (journal, mut recovery) =
        Journal::open(dir, store.clone(), Duration::from_millis(50)).unwrap();
    for t in tables {
        if let Some(snapshot) = recovery.tables.remove(t.name()) {
            t.restore(snapshot).unwrap();
        }
    }
    journal.attach(tables).unwrap();
    (store, journal, recovery)
}

/// What a table holds: (key, priority, each chunk's payload) in insertion order.
fn contents(t: &Table) -> Vec<(u64, f64, Vec<Vec<u8>>)> {
    t.snapshot()
        .items
        .iter()
        .map(|(item, p, _)| {
            let resident = item.resident().unwrap();
            let item = resident.as_ref().unwrap_or(item);
            let data = item.chunks().iter().map(|c| c.payload().to_vec()).collect();
            (item.key, *p, data)
        })
        .collect()
}

#[test]
fn tables_come_back_with_their_items_priorities_data_and_counters() {
    let dir = Dir::new("journal-back");
    let (a, b) = (table("a", 5), table("b", 100));
    let (store, journal, recovery) = open(&dir.0, &[a.clone(), b.clone()]);
    assert!(!recovery.found);
    for key in 1..=8 {
        let t = if key % 2 == 0 { &a } else { &b };
        assert!(matches!(
            t.try_insert(item(&store, key), key as f64).unwrap(),
            InsertOutcome::Inserted
        ));
    }
    // More than a's max size: its oldest go.
    for key in 9..=12 {
        a.try_insert(item(&store, key), 1.0).unwrap();
    }
    b.mutate_items(&[(3, 30.0)], &[5]).unwrap();
    a.try_insert(item(&store, 10), 100.0).unwrap(); // an update
    b.try_sample(2, usize::MAX);
    let before = (contents(&a), contents(&b), a.counters(), b.counters());
    assert_eq!(before.0.len(), 5);
    journal.close();
    store.close();
    drop((a, b, store, journal));

    let (a, b) = (table("a", 5), table("b", 100));
    let (store, journal, recovery) = open(&dir.0, &[a.clone(), b.clone()]);
    assert!(recovery.found);
    assert_eq!(recovery.dropped_items, 0);
    let after = (contents(&a), contents(&b), a.counters(), b.counters());
    assert_eq!(after, before);
    // Changes after the restart are logged too; a second restart keeps them.
    b.reset();
    a.try_insert(item(&store, 20), 2.0).unwrap();
    let before = (contents(&a), contents(&b), a.counters(), b.counters());
    journal.close();
    store.close();

    let (a, b) = (table("a", 5), table("b", 100));
    let (store, _journal, _) = open(&dir.0, &[a.clone(), b.clone()]);
    assert_eq!(
        (contents(&a), contents(&b), a.counters(), b.counters()),
        before
    );
    // Only the live chunks' payloads are kept (one large chunk per item).
    store.maintain();
    assert_eq!(store.stats().chunks, 5);
    let journals = fs::read_dir(&dir.0)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("journal-")
        })
        .count();
    assert_eq!(journals, 1, "older journal files are deleted");
}

#[test]
fn a_torn_tail_is_cut_off_and_what_came_before_served() {
    let dir = Dir::new("journal-torn");
    let t = table("t", 100);
    let (store, journal, _) = open(&dir.0, std::slice::from_ref(&t));
    for key in 1..=3 {
        t.try_insert(item(&store, key), 1.0).unwrap();
    }
    journal.sync();
    let before = contents(&t);
    // A crash: the writer thread keeps its handles, the directory is released, and the
    // journal ends in half a record.
    store.close();
    let path = journal_file(&dir.0);
    let mut file = OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(&[200, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(file);

    let t = table("t", 100);
    let (_store, _journal, recovery) = open(&dir.0, std::slice::from_ref(&t));
    assert_eq!(recovery.torn_bytes, 7);
    assert_eq!(contents(&t), before);
}

#[test]
fn an_item_whose_payload_is_gone_is_left_out_and_counted() {
    let dir = Dir::new("journal-lost");
    let t = table("t", 100);
    let (store, journal, _) = open(&dir.0, std::slice::from_ref(&t));
    for key in 1..=3 {
        t.try_insert(item(&store, key), 1.0).unwrap();
    }
    journal.close();
    store.close();
    // The segments go (a disk replaced, say); small payloads were in the journal.
    for entry in fs::read_dir(&dir.0).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "seg") {
            fs::remove_file(path).unwrap();
        }
    }
    let t = table("t", 100);
    let (_store, _journal, recovery) = open(&dir.0, std::slice::from_ref(&t));
    assert_eq!(recovery.dropped_items, 3);
    assert_eq!(t.size(), 0);
    assert_eq!(t.counters(), (3, 0, 3));
}

#[test]
fn the_journal_starts_afresh_under_churn_and_keeps_what_is_live() {
    let dir = Dir::new("journal-churn");
    let t = table("t", 50);
    let (store, journal, _) = open(&dir.0, std::slice::from_ref(&t));
    journal.rewrite_bytes.store(64 << 10, Ordering::Relaxed);
    let journal_bytes = || -> u64 {
        fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().starts_with("journal-"))
            .map(|e| e.metadata().unwrap().len())
            .sum()
    };
    let mut most = 0;
    for key in 1..=3000 {
        t.try_insert(item(&store, key), key as f64).unwrap();
        if key % 100 == 0 {
            journal.sync();
            journal.rewrite_if_grown().unwrap();
            most = most.max(journal_bytes());
        }
    }
    // 3000 inserts and 2950 deletes logged, ~0.6 MB: started afresh, it stays near 2x what
    // the 50 live items take (and the bound).
    assert!(most < 300 << 10, "{most}");
    let before = contents(&t);
    assert_eq!(before.len(), 50);
    journal.close();
    store.close();
    let t = table("t", 50);
    let (_store, _journal, recovery) = open(&dir.0, std::slice::from_ref(&t));
    assert_eq!(recovery.dropped_items, 0);
    assert_eq!(contents(&t), before);
    assert_eq!(t.counters(), (3000, 0, 2950));
}

#[test]
fn items_deleted_after_their_segments_went_count_as_deletes_not_losses() {
    let dir = Dir::new("journal-fifo-reclaimed");
    let t = table("t", 5);
    let (store, journal, _) = open(&dir.0, std::slice::from_ref(&t));
    // 1 MiB chunks: the first 64 MiB segment fills, its items are all deleted, it is
    // unlinked, and the journal still holds their inserts and deletes.
    for key in 1..=100u64 {
        let big = store
            .store(ChunkData {
                chunk_key: key,
                sequence_range: Some(SequenceRange {
                    episode_id: key,
                    start: 0,
                    end: 0,
                    sparse: false,
                }),
                data: payload(key, 1 << 20).into(),
                data_tensors_len: 1,
                data_uncompressed_size: 1 << 20,
                ..Default::default()
            })
            .unwrap();
        let trajectory = one_column(key);
        let item = ItemData::new(key, &trajectory, vec![big]).unwrap();
        t.try_insert(item, 1.0).unwrap();
        store.maintain();
    }
    assert!(
        !dir.0.join(format!("{:016x}.seg", 0)).exists(),
        "the first segment was reclaimed"
    );
    let before = (contents(&t), t.counters());
    assert_eq!(before.1, (100, 0, 95));
    journal.close();
    store.close();
    let t = table("t", 5);
    let (_store, _journal, recovery) = open(&dir.0, std::slice::from_ref(&t));
    assert_eq!(recovery.dropped_items, 0);
    assert_eq!((contents(&t), t.counters()), before);
    assert!(t.can_sample(1));
}

#[test]
fn small_chunks_of_one_key_with_other_data_come_back_as_each_item_had_them() {
    let dir = Dir::new("journal-small-keys");
    let (a, b) = (table("a", 10), table("b", 10));
    let (store, journal, _) = open(&dir.0, &[a.clone(), b.clone()]);
    let small = |fill: u8| {
        store
            .store(ChunkData {
                chunk_key: 77,
                sequence_range: Some(SequenceRange::default()),
                data: vec![fill; 16].into(),
                data_tensors_len: 1,
                data_uncompressed_size: 16,
                ..Default::default()
            })
            .unwrap()
    };
    let trajectory = one_column(77);
    a.try_insert(
        ItemData::new(1, &trajectory, vec![small(0xAA)]).unwrap(),
        1.0,
    )
    .unwrap();
    b.try_insert(
        ItemData::new(2, &trajectory, vec![small(0xBB)]).unwrap(),
        1.0,
    )
    .unwrap();
    let before = (contents(&a), contents(&b));
    journal.close();
    store.close();
    let (a, b) = (table("a", 10), table("b", 10));
    open(&dir.0, &[a.clone(), b.clone()]);
    assert_eq!((contents(&a), contents(&b)), before);
    assert_eq!(contents(&b)[0].2[0], vec![0xBB; 16]);
}

/// A journal of five items, damaged by `damage`, is refused at opening and left as it is.
fn a_damaged_journal_is_refused(name: &str, damage: impl Fn(&mut Vec<u8>)) {
    let dir = Dir::new(name);
    let t = table("t", 100);
    let (store, journal, _) = open(&dir.0, std::slice::from_ref(&t));
    for key in 1..=5 {
        t.try_insert(item(&store, key), 1.0).unwrap();
    }
    journal.close();
    store.close();
    let path = journal_file(&dir.0);
    let mut bytes = fs::read(&path).unwrap();
    damage(&mut bytes);
    fs::write(&path, &bytes).unwrap();
    let store = ChunkStore::open(&dir.0, 1 << 20).unwrap();
    let err = Journal::open(&dir.0, store, Duration::from_secs(1))
        .err()
        .expect("a damaged journal is refused");
    assert!(err.to_string().contains("is damaged at byte"), "{err}");
    assert_eq!(fs::read(&path).unwrap(), bytes, "nothing was cut");
}

#[test]
fn a_damaged_record_with_records_after_it_fails_opening_and_changes_nothing() {
    a_damaged_journal_is_refused("journal-damaged", |bytes| {
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x10;
    });
    // The second record's length, made to run past the end of the file.
    a_damaged_journal_is_refused("journal-length", |bytes| {
        let first = 8 + u32::from_le_bytes(bytes[0..4].try_into().unwrap()) as usize;
        bytes[first + 3] ^= 0x10;
    });
}

/// `journal.durable()` run to its end on a runtime of its own.
fn durable(journal: &Arc<Journal>) -> io::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(journal.durable())
}

#[test]
fn a_wait_for_durability_made_while_a_sync_runs_is_not_lost() {
    let dir = Dir::new("journal-durable");
    let t = table("t", 100);
    let store = ChunkStore::open(&dir.0, 1 << 20).unwrap();
    // A long interval: a wait that were missed would take it.
    let (journal, _) = Journal::open(&dir.0, store.clone(), Duration::from_secs(20)).unwrap();
    journal.attach(std::slice::from_ref(&t)).unwrap();
    let started = std::time::Instant::now();
    let (first, second) = {
        // The writer thread, woken by the first wait, stops in its sync at this lock.
        let held = journal.file.lock();
        t.try_insert(item(&store, 1), 1.0).unwrap();
        let j = journal.clone();
        let first = std::thread::spawn(move || durable(&j));
        std::thread::sleep(Duration::from_millis(100));
        t.try_insert(item(&store, 2), 1.0).unwrap();
        let j = journal.clone();
        let second = std::thread::spawn(move || durable(&j));
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
        (first, second)
    };
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    journal.close();
    store.close();
    let t = table("t", 100);
    open(&dir.0, std::slice::from_ref(&t));
    assert_eq!(t.size(), 2);
}

#[test]
fn a_failed_rewrite_leaves_no_temporary_file_and_waits_before_trying_again() {
    let dir = Dir::new("journal-rewrite-fails");
    let t = table("t", 10);
    let (store, journal, _) = open(&dir.0, std::slice::from_ref(&t));
    journal.rewrite_bytes.store(4 << 10, Ordering::Relaxed);
    // The next file's name is taken by a directory: the rename fails.
    let generation = journal.file.lock().generation;
    let blocker = dir.0.join(format!("journal-{generation:016x}.log"));
    fs::create_dir_all(blocker.join("x")).unwrap();
    for key in 1..=60 {
        t.try_insert(item(&store, key), 1.0).unwrap();
    }
    let temporary = || {
        fs::read_dir(&dir.0)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "tmp")
            })
            .count()
    };
    journal.sync();
    // (The writer thread may be the one whose attempt fails: either way, one did.)
    let _ = journal.rewrite_if_grown();
    {
        let state = journal.file.lock();
        assert_eq!(state.snapshot_bytes, state.file_bytes, "a rewrite failed");
        assert_eq!(state.generation, generation);
    }
    assert!(
        journal.rewrite_if_grown().is_ok(),
        "not tried again at once"
    );
    assert_eq!(temporary(), 0);
    fs::remove_dir_all(&blocker).unwrap();
    let before = contents(&t);
    journal.close();
    store.close();
    let t = table("t", 10);
    open(&dir.0, std::slice::from_ref(&t));
    assert_eq!(contents(&t), before);
}

#[test]
fn changes_are_durable_within_the_interval_when_syncs_are_slow() {
    // Syncs taking 80 ms, an interval of 300 ms, a change every 5 ms: once the first sync
    // has shown how long syncs take, each change is durable within the interval of its
    // append (a sync starts early enough for its length), not the interval plus two syncs.
    let dir = Dir::new("journal-slow-syncs");
    let t = table("t", 1000);
    let store = ChunkStore::open(&dir.0, 1 << 20).unwrap();
    let interval = Duration::from_millis(300);
    let (journal, _) = Journal::open(&dir.0, store.clone(), interval).unwrap();
    journal.attach(std::slice::from_ref(&t)).unwrap();
    journal.slow_sync_ms.store(80, Ordering::Relaxed);
    let mut appended = Vec::new(); // (bytes appended so far, when, after the first sync)
    let mut worst = Duration::ZERO;
    let started = std::time::Instant::now();
    let mut key = 0;
    while started.elapsed() < Duration::from_secs(3) {
        key += 1;
        t.try_insert(item(&store, key), 1.0).unwrap();
        let learned = journal.stats().syncs > 0;
        appended.push((
            journal.pending.lock().appended,
            std::time::Instant::now(),
            learned,
        ));
        let synced = journal.synced_to.load(Ordering::Acquire);
        appended.retain(|&(upto, when, learned)| {
            if upto <= synced && learned {
                worst = worst.max(when.elapsed());
            }
            upto > synced
        });
        std::thread::sleep(Duration::from_millis(5));
    }
    // (A change still waiting counts as late as it is.)
    for (_, when, _) in &appended {
        worst = worst.max(when.elapsed());
    }
    // (Seen 5 ms late at most: the polling above.)
    assert!(worst <= interval + Duration::from_millis(30), "{worst:?}");
    assert!(journal.stats().syncs > 5);
    journal.close();
}

#[test]
fn failing_syncs_are_retried_an_interval_apart_and_lose_nothing() {
    let dir = Dir::new("journal-failing-syncs");
    let t = table("t", 1000);
    let (store, journal, _) = open(&dir.0, std::slice::from_ref(&t));
    journal.fail_syncs.store(true, Ordering::Relaxed);
    t.try_insert(item(&store, 1), 1.0).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    // (50 ms interval: retried every 100 ms at least, not as fast as the disk answers.)
    let tries = journal.sync_tries.load(Ordering::Relaxed);
    assert!((2..=9).contains(&tries), "{tries}");
    assert!(journal.check().is_err());
    journal.fail_syncs.store(false, Ordering::Relaxed);
    t.try_insert(item(&store, 2), 2.0).unwrap();
    std::thread::sleep(Duration::from_millis(400));
    journal.check().unwrap();
    let before = contents(&t);
    journal.close();
    store.close();
    let t = table("t", 1000);
    let (_store, _journal, _) = open(&dir.0, std::slice::from_ref(&t));
    assert_eq!(contents(&t), before);
    assert_eq!(before.len(), 2);
}
