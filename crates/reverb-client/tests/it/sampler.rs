//! The prefetching sampler against a real server: partial batches are kept across timed-out
//! calls, max_samples is exact over several workers, and a rate-limiter timeout ends cleanly.

use crate::common::{block, client, grpc_client, insert_step, queue, table, T, TRANSPORTS};
use reverb_client::sampler::{Sampler, SamplerOptions};
use reverb_client::transport::shm;
use reverb_client::{Client, Sampled, Tensor};
use reverb_core::SelectorKind;
use reverb_proto::tensorflow::DataType;
use reverb_server::{Server, ServerOptions};
use std::time::Duration;

fn insert(client: &Client, table: &str, value: i64) {
    let t = Tensor::new(
        DataType::DtInt64 as i32,
        vec![],
        value.to_le_bytes().to_vec(),
    )
    .unwrap();
    insert_step(client, vec![t], vec![(table.into(), 1.0)], T).unwrap();
}

fn value(s: &reverb_client::Sampled) -> i64 {
    let column = s.clone().plan().unwrap().columns[0].to_tensor().unwrap();
    i64::from_le_bytes(column.data[..8].try_into().unwrap())
}

fn options(workers: usize, max_samples: Option<u64>, timeout_ms: Option<u64>) -> SamplerOptions {
    SamplerOptions {
        max_in_flight_samples_per_worker: 2,
        num_workers: workers,
        max_samples,
        rate_limiter_timeout: timeout_ms.map(Duration::from_millis),
        shared_memory: true,
        columnar: false,
    }
}

#[test]
fn a_timed_out_call_keeps_what_arrived_for_the_next_call() {
    for transport in TRANSPORTS {
        let server = Server::start(vec![queue("q", 100)], ServerOptions::default()).unwrap();
        let client = client(&server, transport);
        for i in 0..3 {
            insert(&client, "q", i);
        }
        let mut sampler = Sampler::new(client.clone(), "q", options(1, None, None)).unwrap();
        // Three items for a call that wants five: it times out and keeps them...
        assert!(block(sampler.next(5, Duration::from_millis(300)))
            .unwrap()
            .is_none());
        for i in 3..5 {
            insert(&client, "q", i);
        }
        // ...and the next call returns all five, in order.
        let got = block(sampler.next(5, Duration::from_secs(5)))
            .unwrap()
            .unwrap();
        assert_eq!(
            got.iter().map(value).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
    }
}

#[test]
fn max_samples_is_exact_over_several_workers() {
    for transport in TRANSPORTS {
        let uniform = table("u", SelectorKind::Uniform, 100);
        let server = Server::start(vec![uniform], ServerOptions::default()).unwrap();
        let client = client(&server, transport);
        insert(&client, "u", 7);
        let mut sampler = Sampler::new(client, "u", options(3, Some(11), None)).unwrap();
        let mut total = 0;
        loop {
            match block(sampler.next_ready(4, Duration::from_secs(5))).unwrap() {
                Some(v) if v.is_empty() => break,
                Some(v) => {
                    assert!(v.iter().all(|s| value(s) == 7));
                    total += v.len();
                }
                None => panic!("the sampler stalled"),
            }
        }
        assert_eq!(total, 11);
    }
}

#[test]
fn a_rate_limiter_timeout_ends_the_stream_without_error() {
    for transport in TRANSPORTS {
        let server = Server::start(vec![queue("q", 100)], ServerOptions::default()).unwrap();
        let client = client(&server, transport);
        // An empty table blocks every sample: with a 100 ms timeout, both workers end.
        let mut sampler = Sampler::new(client, "q", options(2, None, Some(100))).unwrap();
        let got = block(sampler.next(1, Duration::from_secs(10))).unwrap();
        assert!(matches!(got, Some(v) if v.is_empty()));
    }
}

#[test]
fn zero_samples_is_rejected() {
    for transport in TRANSPORTS {
        let fifo = table("q", SelectorKind::Fifo, 100);
        let server = Server::start(vec![fifo], ServerOptions::default()).unwrap();
        let client = client(&server, transport);
        let mut sampler = Sampler::new(client, "q", options(1, None, Some(100))).unwrap();
        assert!(block(sampler.next(0, Duration::from_secs(1))).is_err());
    }
}

/// `len` incompressible bytes that start with `i`.
fn frame(i: i64, len: usize) -> Vec<u8> {
    let mut x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut v = i.to_le_bytes().to_vec();
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

/// Takes `n` samples of frames, checks each one's bytes, and returns their indices, sorted.
/// With `keep`, the samples are kept there; else each is dropped once checked.
fn take_frames(
    sampler: &mut Sampler,
    n: usize,
    len: usize,
    mut keep: Option<&mut Vec<Sampled>>,
) -> Vec<i64> {
    let mut seen = Vec::new();
    while seen.len() < n {
        let got = block(sampler.next_ready(64, Duration::from_secs(5)))
            .unwrap()
            .expect("the sampler stalled");
        for s in got {
            let data = s.clone().plan().unwrap().columns[0]
                .to_tensor()
                .unwrap()
                .data;
            let i = i64::from_le_bytes(data[..8].try_into().unwrap());
            assert!(data[..] == frame(i, len)[..], "sample {i} has wrong bytes");
            seen.push(i);
            if let Some(keep) = keep.as_mut() {
                keep.push(s);
            }
        }
    }
    seen.sort();
    seen
}

#[test]
fn big_chunks_come_through_shared_memory_and_inline_when_the_ring_is_full() {
    const LEN: usize = 40_000;
    const N: i64 = 1000; // 40 MB: more than the ring (4 MiB for 16 samples in flight)
    let server = Server::start(vec![queue("q", 2 * N)], ServerOptions::default()).unwrap();
    let client = grpc_client(&server);
    let fill = |from: i64| {
        for i in from..from + N {
            let t = Tensor::new(DataType::DtUint8 as i32, vec![LEN as i64], frame(i, LEN)).unwrap();
            insert_step(&client, vec![t], vec![("q".into(), 1.0)], T).unwrap();
        }
    };
    let mut opts = options(1, Some(N as u64), None);
    opts.max_in_flight_samples_per_worker = 16;

    // Every sample is held: the ring fills up and the rest come inline.
    fill(0);
    let before = shm::chunks_received();
    let mut sampler = Sampler::new(client.clone(), "q", opts.clone()).unwrap();
    let mut held = Vec::new();
    assert_eq!(
        take_frames(&mut sampler, N as usize, LEN, Some(&mut held)),
        (0..N).collect::<Vec<_>>()
    );
    let through_ring = shm::chunks_received() - before;
    assert!(
        through_ring > 0 && through_ring < N as u64,
        "{through_ring} of {N} via the ring"
    );
    drop(sampler);
    drop(held);

    // Samples dropped as they come: their space is reused, and nearly all come through the
    // ring.
    fill(N);
    let before = shm::chunks_received();
    let mut sampler = Sampler::new(client.clone(), "q", opts.clone()).unwrap();
    let seen = take_frames(&mut sampler, N as usize, LEN, None);
    assert_eq!(seen, (N..2 * N).collect::<Vec<_>>());
    let through_ring = shm::chunks_received() - before;
    assert!(
        through_ring > N as u64 * 9 / 10,
        "{through_ring} of {N} via the ring"
    );

    // Without shared memory, everything is inline.
    fill(2 * N);
    opts.shared_memory = false;
    let before = shm::chunks_received();
    let mut sampler = Sampler::new(client, "q", opts).unwrap();
    let seen = take_frames(&mut sampler, N as usize, LEN, None);
    assert_eq!(seen, (2 * N..3 * N).collect::<Vec<_>>());
    assert_eq!(shm::chunks_received(), before);
}

#[test]
fn an_inproc_sampler_follows_its_server_to_a_restart_on_the_same_port() {
    let server = Server::start(vec![queue("q", 100)], ServerOptions::default()).unwrap();
    let port = server.port();
    let client = client(&server, "inproc");
    insert(&client, "q", 1);
    let mut sampler = Sampler::new(client.clone(), "q", options(1, None, None)).unwrap();
    let got = block(sampler.next(1, Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    assert_eq!(value(&got[0]), 1);
    server.stop();
    let options = ServerOptions {
        port,
        ..ServerOptions::default()
    };
    let _restarted = Server::start(vec![queue("q", 100)], options).unwrap();
    insert(&client, "q", 2);
    let got = block(sampler.next(1, Duration::from_secs(5)))
        .unwrap()
        .unwrap();
    assert_eq!(value(&got[0]), 2);
}
