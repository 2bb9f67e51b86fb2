//! The segment log against a model, across reopenings, torn writes, flipped bytes, a second
//! opener and churn.

use super::*;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

use crate::test_dir::Dir;

fn payload(key: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(key);
    let mut out = vec![0u8; len];
    rng.fill(&mut out[..]);
    out
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    out.sort();
    out
}

#[test]
fn chunks_come_back_after_reopening() {
    let dir = Dir::new("segment-log-reopen");
    {
        let (mut log, found) = SegmentLog::open(&dir.0, 4096).unwrap();
        assert_eq!(found, Recovered::default());
        for key in 0..50 {
            log.put(key, &payload(key, 300)).unwrap();
        }
        log.delete(7).unwrap();
        log.put(3, b"three again").unwrap();
        log.sync().unwrap();
        assert!(segments(&dir.0).len() > 1, "several segments");
    }
    let (log, found) = SegmentLog::open(&dir.0, 4096).unwrap();
    // (Deletes are not logged: the owner retains what its items reference.)
    assert_eq!(found.chunks, 50);
    assert_eq!(found.torn_bytes, 0);
    assert_eq!(log.get(3).unwrap().unwrap(), b"three again");
    for key in (0..50).filter(|&k| k != 3) {
        assert_eq!(
            log.get(key).unwrap().unwrap(),
            payload(key, 300),
            "chunk {key}"
        );
    }
    assert_eq!(log.get(99).unwrap(), None);
}

#[test]
fn a_torn_write_is_cut_off_and_the_rest_recovered() {
    let dir = Dir::new("segment-log-torn");
    {
        let (mut log, _) = SegmentLog::open(&dir.0, 1 << 20).unwrap();
        for key in 0..10 {
            log.put(key, &payload(key, 1000)).unwrap();
        }
    }
    let newest = segments(&dir.0).pop().unwrap();
    let size = fs::metadata(&newest).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(size - 37)
        .unwrap();
    let (mut log, found) = SegmentLog::open(&dir.0, 1 << 20).unwrap();
    assert_eq!(found.chunks, 9);
    assert_eq!(found.torn_bytes, HEADER + 1000 - 37);
    assert_eq!(log.get(9).unwrap(), None);
    for key in 0..9 {
        assert_eq!(log.get(key).unwrap().unwrap(), payload(key, 1000));
    }
    // Writing goes on where the last whole record ended.
    log.put(9, b"again").unwrap();
    drop(log);
    let (log, found) = SegmentLog::open(&dir.0, 1 << 20).unwrap();
    assert_eq!((found.chunks, found.torn_bytes), (10, 0));
    assert_eq!(log.get(9).unwrap().unwrap(), b"again");
}

#[test]
fn a_flipped_byte_is_never_served() {
    let dir = Dir::new("segment-log-flip");
    let (mut log, _) = SegmentLog::open(&dir.0, 4096).unwrap();
    for key in 0..20 {
        log.put(key, &payload(key, 900)).unwrap();
    }
    // Under an open log: the read that meets it fails.
    let first = segments(&dir.0).remove(0);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&first)
        .unwrap();
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, HEADER + 100).unwrap();
    file.write_all_at(&[byte[0] ^ 0x10], HEADER + 100).unwrap();
    let err = log.get(0).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("chunk 0"), "{err}");
    assert_eq!(log.get(1).unwrap().unwrap(), payload(1, 900));
    drop(log);
    // On reopening: reported, and left out with what follows it in its segment.
    let (log, found) = SegmentLog::open(&dir.0, 4096).unwrap();
    assert_eq!(found.corrupt.len(), 1);
    assert_eq!(log.get(0).unwrap(), None);
    assert_eq!(log.get(19).unwrap().unwrap(), payload(19, 900));
}

#[test]
fn a_directory_is_held_by_one_log() {
    let dir = Dir::new("segment-log-lock");
    let (_log, _) = SegmentLog::open(&dir.0, 4096).unwrap();
    let err = SegmentLog::open(&dir.0, 4096).err().unwrap();
    assert!(err.to_string().contains("held by another server"), "{err}");
}

/// Puts `churn` chunks of `len` bytes into a log holding `live` of them, deleting the
/// oldest (`fifo`) or a random one for each; checks every chunk, returns the log's bytes.
fn churn(fifo: bool, live: u64, churn: u64, len: usize) -> (u64, u64, u64) {
    let dir = Dir::new("segment-log-churn");
    let (mut log, _) = SegmentLog::open(&dir.0, 64 * 1024).unwrap();
    let mut slots: Vec<u64> = (0..live).collect();
    for key in 0..live {
        log.put(key, &payload(key, len)).unwrap();
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for key in live..live + churn {
        log.put(key, &payload(key, len)).unwrap();
        let slot = if fifo {
            (key % live) as usize
        } else {
            rng.random_range(0..slots.len())
        };
        assert!(log
            .delete(std::mem::replace(&mut slots[slot], key))
            .unwrap());
    }
    for &key in &slots {
        assert_eq!(
            log.get(key).unwrap().unwrap(),
            payload(key, len),
            "chunk {key}"
        );
    }
    assert_eq!(log.len(), live as usize);
    let (all, held) = log.bytes();
    (all, held, log.copied())
}

#[test]
fn space_comes_back_under_churn() {
    let record = HEADER + 1000;
    // FIFO: whole segments die; nothing is copied.
    let (all, held, copied) = churn(true, 500, 3000, 1000);
    assert_eq!(held, 500 * record);
    assert!(
        all <= held + 2 * 64 * 1024 + record,
        "{all} bytes for {held} live"
    );
    assert_eq!(copied, 0);
    // Random deletes: segments under half live are compacted.
    let (all, held, copied) = churn(false, 500, 3000, 1000);
    assert_eq!(held, 500 * record);
    assert!(
        all <= 2 * held + 2 * 64 * 1024,
        "{all} bytes for {held} live"
    );
    assert!(copied > 0);
}

#[test]
fn retain_keeps_what_is_referenced() {
    let dir = Dir::new("segment-log-retain");
    let (mut log, _) = SegmentLog::open(&dir.0, 4096).unwrap();
    for key in 0..30 {
        log.put(key, &payload(key, 200)).unwrap();
    }
    log.retain(|key| key % 3 == 0).unwrap();
    let mut keys: Vec<u64> = log.keys().collect();
    keys.sort_unstable();
    assert_eq!(keys, (0..30).filter(|k| k % 3 == 0).collect::<Vec<_>>());
    for key in keys {
        assert_eq!(log.get(key).unwrap().unwrap(), payload(key, 200));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    // Puts, deletes and reopenings in any order: the log holds what a map would (deletes
    // forgotten by a reopening come back: the owner retains what its items reference).
    #[test]
    fn the_log_agrees_with_a_map(
        ops in proptest::collection::vec((0u8..10, 0u64..40, 1usize..700), 1..150),
        segment in 1000u64..5000,
    ) {
        let dir = Dir::new("segment-log-model");
        let (mut log, _) = SegmentLog::open(&dir.0, segment).unwrap();
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut written: HashMap<u64, Vec<u8>> = HashMap::new();
        for &(op, key, len) in &ops {
            match op {
                0..=5 => {
                    let value = payload(key * 1000 + len as u64, len);
                    log.put(key, &value).unwrap();
                    model.insert(key, value.clone());
                    written.insert(key, value);
                }
                6..=8 => {
                    prop_assert_eq!(log.delete(key).unwrap(), model.remove(&key).is_some());
                }
                _ => {
                    log.sync().unwrap();
                    drop(log);
                    let reopened = SegmentLog::open(&dir.0, segment).unwrap();
                    log = reopened.0;
                    prop_assert_eq!(reopened.1.torn_bytes, 0);
                    // What was deleted since it was written may come back (the latest
                    // version of it, or an older one compaction copied): the owner drops
                    // what no item references.
                    log.retain(|k| model.contains_key(&k)).unwrap();
                }
            }
            prop_assert_eq!(log.len(), model.len());
            for (k, v) in &model {
                let got = log.get(*k).unwrap();
                prop_assert_eq!(got.as_ref(), Some(v));
            }
        }
        let _ = written;
    }
}

#[test]
fn a_linked_segment_never_changes_and_outlives_compaction() {
    let (dir, elsewhere) = (Dir::new("segment-log-link"), Dir::new("segment-log-linked"));
    fs::create_dir_all(&elsewhere.0).unwrap();
    let (mut log, _) = SegmentLog::open(&dir.0, 64 << 10).unwrap();
    for key in 0..600 {
        log.put(key, &payload(key, 1000)).unwrap();
    }
    let mut linked = std::collections::HashSet::new();
    // A chunk in the active segment is linked only once the segment is sealed.
    assert!(log.link(599, &elsewhere.0, &mut linked).is_err());
    log.seal().unwrap();
    let places: Vec<Place> = (0..600)
        .map(|key| log.link(key, &elsewhere.0, &mut linked).unwrap().unwrap())
        .collect();
    let sizes = || -> Vec<(PathBuf, u64)> {
        let mut out: Vec<_> = segments(&elsewhere.0)
            .into_iter()
            .map(|p| (p.clone(), fs::metadata(&p).unwrap().len()))
            .collect();
        out.sort();
        out
    };
    let before = sizes();
    assert_eq!(before.len(), linked.len());
    // Random deletions compact segments; new chunks are appended, then go.
    for key in (0..600).filter(|k| k % 3 != 0) {
        log.delete(key).unwrap();
    }
    for key in 600..800 {
        log.put(key, &payload(key, 1000)).unwrap();
    }
    for key in 600..800 {
        log.delete(key).unwrap();
    }
    assert!(log.copied() > 0, "compacted");
    let gone = before
        .iter()
        .filter(|(linked, _)| !dir.0.join(linked.file_name().unwrap()).exists())
        .count();
    assert!(
        gone > 0,
        "some linked segments were compacted and unlinked in the log"
    );
    drop(log);
    assert_eq!(sizes(), before, "the linked files did not change");
    for (key, place) in places.into_iter().enumerate() {
        let path = elsewhere.0.join(segment_name(place.segment));
        let file = File::open(&path).unwrap();
        let back = read_record(&file, &path, key as u64, place, &mut [], |n| vec![0u8; n]).unwrap();
        assert_eq!(back, payload(key as u64, 1000), "chunk {key}");
    }
}

#[test]
fn a_chunk_in_the_active_segment_is_linked_even_when_sealing_compacts() {
    // (Found in review: a seal that compacts its segment at once moved the chunk about to
    // be linked into the new active segment.)
    let (dir, elsewhere) = (
        Dir::new("segment-log-seal-link"),
        Dir::new("segment-log-sealed"),
    );
    fs::create_dir_all(&elsewhere.0).unwrap();
    let (mut log, _) = SegmentLog::open(&dir.0, 1000).unwrap();
    log.put(1, &payload(1, 10)).unwrap();
    log.put(2, &payload(2, 5000)).unwrap(); // (larger than a segment)
    log.delete(2).unwrap();
    let mut linked = std::collections::HashSet::new();
    let place = log
        .seal_and_link(1, &elsewhere.0, &mut linked)
        .unwrap()
        .unwrap();
    assert_ne!(
        log.place(1).unwrap().segment,
        place.segment,
        "compacted since"
    );
    let path = elsewhere.0.join(segment_name(place.segment));
    let file = File::open(&path).unwrap();
    assert_eq!(
        read_record(&file, &path, 1, place, &mut [], |n| vec![0u8; n]).unwrap(),
        payload(1, 10)
    );
}
