//! One-shot sampling of several servers used as one table (`sample_shards`, behind
//! `ShardedClient.sample`), against real servers: shards drawn by weight with global
//! probabilities and sizes, dead shards skipped, queues taken one sample at a time.

use reverb_client::sampler::sample_shards;
use reverb_client::{Client, Tensor};

use crate::common::{block, grpc_client, insert_step, queue, table, T};
use reverb_core::SelectorKind;
use reverb_proto::tensorflow::DataType;
use reverb_server::{Server, ServerOptions};
use std::collections::HashMap;
use tonic::Code;

/// Inserts items holding `values` into `table`; their keys, by value.
fn fill(client: &Client, table: &str, values: std::ops::Range<i64>) -> HashMap<u64, i64> {
    values
        .map(|v| {
            let step = Tensor::new(DataType::DtInt64 as i32, vec![], v.to_le_bytes().to_vec());
            let keys = insert_step(client, vec![step.unwrap()], vec![(table.into(), 1.0)], T);
            (keys.unwrap()[0], v)
        })
        .collect()
}

fn value(sample: &reverb_client::Sample) -> i64 {
    i64::from_le_bytes(sample.columns[0].data[..8].try_into().unwrap())
}

#[test]
fn samples_follow_the_shards_sizes_with_global_probabilities() {
    let servers: Vec<Server> = (0..2)
        .map(|_| {
            let t = table("t", SelectorKind::Uniform, 100);
            Server::start(vec![t], ServerOptions::default()).unwrap()
        })
        .collect();
    let clients: Vec<Client> = servers.iter().map(grpc_client).collect();
    let held = [
        fill(&clients[0], "t", 0..10),
        fill(&clients[1], "t", 100..130),
    ];
    let mut missing = vec![false; 2];
    let out = block(sample_shards(&clients, &mut missing, "t", 400, T)).unwrap();
    assert!(out.failure.is_none(), "{:?}", out.failure);
    assert_eq!((out.samples.len(), out.shards.len()), (400, 400));
    let mut per_shard = [0; 2];
    for (sample, &shard) in out.samples.iter().zip(&out.shards) {
        let key = sample.info.item.as_ref().unwrap().key;
        assert_eq!(held[shard].get(&key), Some(&value(sample)), "shard {shard}");
        // Uniform over the union of 40 items: 1/10 x 1/4 = 1/30 x 3/4.
        assert!((sample.info.probability - 1.0 / 40.0).abs() < 1e-12);
        assert_eq!(sample.info.table_size, 40);
        per_shard[shard] += 1;
    }
    // 100 of 400 expected from the first shard (a binomial's sd is about 9).
    assert!((50..150).contains(&per_shard[0]), "{per_shard:?}");
    assert_eq!(missing, vec![false, false]);
}

#[test]
fn a_shard_that_cannot_be_reached_is_skipped_and_noted_missing() {
    let server = Server::start(
        vec![table("t", SelectorKind::Uniform, 100)],
        ServerOptions::default(),
    )
    .unwrap();
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = Client::new(&format!("127.0.0.1:{dead_port}")).unwrap();
    let live = grpc_client(&server);
    fill(&live, "t", 0..5);
    let clients = vec![dead, live];
    let mut missing = vec![false; 2];
    let out = block(sample_shards(&clients, &mut missing, "t", 20, T)).unwrap();
    assert!(out.failure.is_none(), "{:?}", out.failure);
    assert_eq!(out.shards, vec![1; 20]);
    assert_eq!(out.samples.len(), 20);
    assert!(out
        .samples
        .iter()
        .all(|s| (s.info.probability - 0.2).abs() < 1e-12 && s.info.table_size == 5));
    assert_eq!(missing, vec![true, false]);
}

#[test]
fn queues_give_one_sample_per_call_and_unknown_tables_say_so() {
    let servers: Vec<Server> = (0..2)
        .map(|_| Server::start(vec![queue("q", 100)], ServerOptions::default()).unwrap())
        .collect();
    let clients: Vec<Client> = servers.iter().map(grpc_client).collect();
    fill(&clients[0], "q", 0..3);
    fill(&clients[1], "q", 10..13);
    let mut missing = vec![false; 2];
    // Sampling deletes: one at a time, so a caller that stops early takes nothing more.
    let out = block(sample_shards(&clients, &mut missing, "q", 4, T)).unwrap();
    assert_eq!(out.samples.len(), 1);
    let left: i64 = servers
        .iter()
        .map(|s| block(grpc_client(s).server_info(T)).unwrap()[0].current_size)
        .sum();
    assert_eq!(left, 5);
    let out = block(sample_shards(&clients, &mut missing, "nope", 1, T)).unwrap();
    assert!(out.samples.is_empty());
    let e = out.failure.expect("an unknown table fails");
    assert_eq!(e.code, Code::NotFound, "{}", e.message);
}
