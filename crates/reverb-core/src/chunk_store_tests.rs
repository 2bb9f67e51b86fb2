//! The chunk store: payloads back through a bounded cache, space back when chunks go, keys
//! stored twice, a flipped byte, a second opener.

use super::*;
use rand::{Rng, SeedableRng};
use reverb_proto::SequenceRange;
use std::fs;

use crate::test_dir::Dir;

fn data(key: u64, len: usize) -> ChunkData {
    let mut rng = rand::rngs::StdRng::seed_from_u64(key);
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes[..]);
    ChunkData {
        chunk_key: key,
        sequence_range: Some(SequenceRange {
            episode_id: key / 10,
            start: (key % 10) as i32,
            end: (key % 10) as i32 + 1,
            sparse: false,
        }),
        data: bytes.into(),
        data_tensors_len: 2,
        data_uncompressed_size: len as i64 * 2,
        delta_encoded: key.is_multiple_of(2),
        ..Default::default()
    }
}

/// The chunk's wire form read back through its store.
fn read_back(chunk: &Arc<Chunk>) -> ChunkData {
    chunk.resident().unwrap().data()
}

#[test]
fn payloads_come_back_through_a_cache_a_tenth_of_them() {
    let dir = Dir::new("chunk-store-cache");
    let store = ChunkStore::open(&dir.0, 100 * 1000).unwrap();
    let chunks: Vec<Arc<Chunk>> = (0..1000)
        .map(|k| store.store(data(k, 1000)).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c.is_stored() && c.payload().is_empty()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..3000 {
        let k = rng.random_range(0..1000u64);
        let back = read_back(&chunks[k as usize]);
        assert_eq!(back, data(k, 1000), "chunk {k}");
        assert!(store.stats().cache_bytes <= 100 * 1000);
    }
    let stats = store.stats();
    assert_eq!(stats.chunks, 1000);
    assert!(stats.misses > 2000, "{stats:?}");
    assert!(stats.hits > 0, "{stats:?}");
    assert_eq!(stats.errors, 0);
}

#[test]
fn small_payloads_stay_in_memory() {
    let dir = Dir::new("chunk-store-small");
    let store = ChunkStore::open(&dir.0, 1 << 20).unwrap();
    let small = store.store(data(1, 40)).unwrap();
    assert!(!small.is_stored());
    assert_eq!(small.data(), data(1, 40));
    assert_eq!(store.stats().chunks, 0);
}

#[test]
fn dropped_chunks_give_their_space_back() {
    let dir = Dir::new("chunk-store-space");
    let store = ChunkStore::open(&dir.0, 1 << 20).unwrap();
    let mut live = VecDeque::new();
    // FIFO churn: 64 MiB segments fill and die.
    for k in 0..2000u64 {
        live.push_back(store.store(data(k, 100_000)).unwrap());
        if live.len() > 100 {
            live.pop_front();
        }
    }
    store.maintain();
    let stats = store.stats();
    assert_eq!(stats.chunks, 100);
    assert!(
        stats.disk_bytes < 3 * SEGMENT_BYTES + 10_000_000,
        "{stats:?}"
    );
    drop(live);
    store.maintain();
    assert_eq!(store.stats().chunks, 0);
}

#[test]
fn a_key_stored_twice_stays_until_both_are_gone() {
    let dir = Dir::new("chunk-store-twice");
    let store = ChunkStore::open(&dir.0, 0).unwrap();
    let first = store.store(data(5, 500)).unwrap();
    let second = store.store(data(5, 500)).unwrap();
    drop(first);
    store.maintain();
    assert_eq!(read_back(&second), data(5, 500));
    drop(second);
    store.maintain();
    assert_eq!(store.stats().chunks, 0);
}

#[test]
fn a_flipped_byte_is_an_error_naming_the_store_not_data() {
    let dir = Dir::new("chunk-store-flip");
    let store = ChunkStore::open(&dir.0, 0).unwrap();
    let chunk = store.store(data(9, 4000)).unwrap();
    let segment = fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .unwrap();
    let mut bytes = fs::read(&segment).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x40;
    fs::write(&segment, bytes).unwrap();
    let err = chunk.resident().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    let message = err.to_string();
    assert!(message.contains(&dir.0.display().to_string()), "{message}");
    assert!(message.contains("chunk 9"), "{message}");
    assert_eq!(store.stats().errors, 1);
}

#[test]
fn a_second_store_on_a_directory_is_refused() {
    let dir = Dir::new("chunk-store-twice-open");
    let _store = ChunkStore::open(&dir.0, 0).unwrap();
    let err = ChunkStore::open(&dir.0, 0).unwrap_err();
    assert!(err.to_string().contains("held by another server"), "{err}");
}

#[test]
fn an_item_reads_its_stored_chunks_back() {
    use reverb_proto::{flat_trajectory, FlatTrajectory};
    let dir = Dir::new("chunk-store-item");
    let store = ChunkStore::open(&dir.0, 0).unwrap();
    let chunks = vec![
        store.store(data(20, 3000)).unwrap(),
        store.store(data(21, 10)).unwrap(),
    ];
    let trajectory = FlatTrajectory {
        columns: [20u64, 21]
            .iter()
            .map(|&k| flat_trajectory::Column {
                chunk_slices: vec![flat_trajectory::ChunkSlice {
                    chunk_key: k,
                    offset: 0,
                    length: 1,
                    index: 0,
                }],
                squeeze: false,
            })
            .collect(),
    };
    let item = crate::ItemData::new(1, &trajectory, chunks).unwrap();
    let resident = item.resident().unwrap().expect("one chunk is stored");
    assert!(resident.chunks().iter().all(|c| !c.is_stored()));
    assert_eq!(resident.chunks()[0].payload(), &data(20, 3000).data[..]);
    assert_eq!(resident.chunks()[1].payload(), &data(21, 10).data[..]);
    assert!(resident.resident().unwrap().is_none());
    assert_eq!(resident.to_proto("t", 1.0, 0), item.to_proto("t", 1.0, 0));
}

#[test]
fn a_key_stored_again_with_other_data_is_refused_and_the_first_kept() {
    let dir = Dir::new("chunk-store-collide");
    let store = ChunkStore::open(&dir.0, 1 << 20).unwrap();
    let first = store.store(data(5, 500)).unwrap();
    let mut other = data(5, 500);
    other.data = vec![1u8; 500].into();
    let err = store.store(other).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(
        err.to_string().contains("Chunk 5 is stored already"),
        "{err}"
    );
    store.maintain();
    assert_eq!(read_back(&first), data(5, 500));
}

#[test]
fn the_cache_ring_stays_bounded_when_one_key_comes_and_goes() {
    let dir = Dir::new("chunk-store-ring");
    let store = ChunkStore::open(&dir.0, 1 << 20).unwrap();
    let chunk = store.store(data(1, 500)).unwrap();
    for _ in 0..10_000 {
        store.cache.lock().remove(1);
        read_back(&chunk);
    }
    let cache = store.cache.lock();
    assert!(cache.ring.len() <= 2, "{}", cache.ring.len());
    assert_eq!(cache.bytes, 500);
}

#[test]
fn a_closed_store_releases_its_directory_and_keeps_its_data() {
    let dir = Dir::new("chunk-store-close");
    let store = ChunkStore::open(&dir.0, 0).unwrap();
    let chunk = store.store(data(3, 5000)).unwrap();
    store.close();
    assert!(chunk
        .resident()
        .unwrap_err()
        .to_string()
        .contains("is closed"));
    drop(chunk);
    let again = ChunkStore::open(&dir.0, 0).unwrap();
    assert_eq!(
        again.stats().chunks,
        1,
        "dropping after closing forgets nothing"
    );
}

#[test]
fn reads_reuse_the_buffers_of_payloads_read_before() {
    let dir = Dir::new("chunk-store-spare");
    let store = ChunkStore::open(&dir.0, 0).unwrap();
    let (a, b) = (
        store.store(data(1, 1000)).unwrap(),
        store.store(data(2, 1000)).unwrap(),
    );
    let first = a.resident().unwrap();
    let buffer = first.payload().as_ptr();
    assert_eq!(first.data(), data(1, 1000));
    drop(first);
    // (The first read's buffer, given back as its chunk went, holds the second.)
    let second = b.resident().unwrap();
    assert_eq!(second.payload().as_ptr(), buffer);
    assert_eq!(second.data(), data(2, 1000));
    drop(second);
    // A nearby length (the same size class) reuses it too; another gets one of its own.
    let c = store.store(data(3, 1010)).unwrap();
    let third = c.resident().unwrap();
    assert_eq!(third.payload().as_ptr(), buffer);
    assert_eq!(third.data(), data(3, 1010));
    let d = store.store(data(4, 3000)).unwrap();
    assert_eq!(d.resident().unwrap().data(), data(4, 3000));
}

#[test]
fn spare_buffers_stay_bounded_whatever_the_lengths() {
    let dir = Dir::new("chunk-store-spare-bound");
    let store = ChunkStore::open(&dir.0, 0).unwrap();
    for key in 0..3000u64 {
        let len = 100 + (key as usize * 997) % 50_000;
        let chunk = store.store(data(key, len)).unwrap();
        assert_eq!(chunk.resident().unwrap().data(), data(key, len));
        assert!(store.spare.lock().bytes <= 1 << 20);
    }
    assert!(size_class(1000) >= 1000 && size_class(1000) < 1250);
    assert_eq!(size_class(1024), 1024);
    assert_eq!(size_class(1025), 1280);
}
