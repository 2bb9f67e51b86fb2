//! Fills one table to N small items (each its own chunk, random keys) and reports the slowest
//! inserts: the table's lock is held through each, so a slow insert stalls every sampler of
//! the table for as long. `cargo run --release -p reverb-core --example growth -- 10000000
//! [uniform|prioritized]`.

use bytes::Bytes;
use reverb_core::table::{InsertOutcome, TableConfig};
use reverb_core::{Chunk, ItemData, RateLimiterConfig, SelectorKind, Table};
use reverb_proto::{flat_trajectory, ChunkData, FlatTrajectory, SequenceRange};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn item(key: u64) -> ItemData {
    let chunk = Arc::new(Chunk::new(ChunkData {
        chunk_key: key,
        sequence_range: Some(SequenceRange {
            episode_id: key,
            start: 0,
            end: 1,
            sparse: false,
        }),
        data: Bytes::from_static(&[0u8; 16]),
        ..Default::default()
    }));
    let columns = vec![flat_trajectory::Column {
        chunk_slices: vec![flat_trajectory::ChunkSlice {
            chunk_key: key,
            offset: 0,
            length: 2,
            index: 0,
        }],
        squeeze: false,
    }];
    ItemData::new(key, &FlatTrajectory { columns }, vec![chunk]).expect("valid item")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().map_or(10_000_000, |a| a.parse().expect("N"));
    let sampler = match args.next().as_deref() {
        Some("prioritized") => SelectorKind::Prioritized {
            priority_exponent: 0.8,
        },
        _ => SelectorKind::Uniform,
    };
    let table = Table::new(TableConfig {
        name: "growth".into(),
        sampler,
        remover: SelectorKind::Fifo,
        max_size: n as i64,
        max_times_sampled: 0,
        rate_limiter: RateLimiterConfig::min_size(1),
        signature: None,
    })
    .expect("valid table");
    let mut slowest: Vec<(Duration, u64)> = Vec::new();
    let mut key: u64 = 0x9E37_79B9_7F4A_7C15;
    let start = Instant::now();
    for i in 0..n {
        key = key
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let it = item(key);
        let t = Instant::now();
        let outcome = table.try_insert(it, 1.0).expect("insert");
        let took = t.elapsed();
        assert!(matches!(outcome, InsertOutcome::Inserted));
        if took > Duration::from_millis(5) {
            slowest.push((took, i));
        }
    }
    let total = start.elapsed();
    println!(
        "{n} inserts in {:.2} s ({:.2} us each); inserts over 5 ms: {}",
        total.as_secs_f64(),
        total.as_secs_f64() * 1e6 / n as f64,
        slowest.len()
    );
    slowest.sort();
    for (took, at) in slowest.iter().rev().take(8) {
        println!("  {:>8.1} ms at item {at}", took.as_secs_f64() * 1e3);
    }
}
