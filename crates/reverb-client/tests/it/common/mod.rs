//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test file uses a different subset

use reverb_client::writer::Inserter;
use reverb_client::{Client, Tensor};
use reverb_core::{RateLimiterConfig, SelectorKind, Table, TableConfig};
use reverb_server::Server;
use std::sync::Arc;
use std::time::Duration;

/// The deadline of calls that should succeed quickly.
pub const T: Option<Duration> = Some(Duration::from_secs(10));

/// A table with a FIFO remover that may be sampled once it holds one item.
pub fn table(name: &str, sampler: SelectorKind, max_size: i64) -> Arc<Table> {
    fifo_removed(name, sampler, max_size, 0)
}

/// A queue as `Table.queue` makes it: FIFO, each item sampled once, sampling waits while it
/// is empty and inserts while it holds `size` items.
pub fn blocking_queue(name: &str, size: i64) -> Arc<Table> {
    Arc::new(
        Table::new(TableConfig {
            name: name.into(),
            sampler: SelectorKind::Fifo,
            remover: SelectorKind::Fifo,
            max_size: size,
            max_times_sampled: 1,
            rate_limiter: RateLimiterConfig {
                samples_per_insert: 1.0,
                min_size_to_sample: 1,
                min_diff: 0.0,
                max_diff: size as f64,
            },
            signature: None,
        })
        .unwrap(),
    )
}

/// A queue: FIFO, each item sampled once; sampling waits while the table is empty.
pub fn queue(name: &str, max_size: i64) -> Arc<Table> {
    fifo_removed(name, SelectorKind::Fifo, max_size, 1)
}

fn fifo_removed(
    name: &str,
    sampler: SelectorKind,
    max_size: i64,
    max_times_sampled: i32,
) -> Arc<Table> {
    Arc::new(
        Table::new(TableConfig {
            name: name.into(),
            sampler,
            remover: SelectorKind::Fifo,
            max_size,
            max_times_sampled,
            rate_limiter: RateLimiterConfig::min_size(1),
            signature: None,
        })
        .unwrap(),
    )
}

/// Runs a client future on the client runtime.
pub fn block<F: std::future::Future>(f: F) -> F::Output {
    reverb_client::runtime().block_on(f)
}

/// A client of `server` over gRPC (loopback), even though the server runs in this process.
pub fn grpc_client(server: &Server) -> Client {
    Client::new(&format!("localhost:{}", server.port()))
        .unwrap()
        .with_inproc(false)
}

/// A client of `server` that calls it in-process.
pub fn inproc_client(server: &Server) -> Client {
    let client = Client::new(&format!("localhost:{}", server.port())).unwrap();
    assert!(client.inproc().is_some(), "the server is in this process");
    client
}

/// The two ways a test client reaches a server of its own process.
pub const TRANSPORTS: [&str; 2] = ["grpc", "inproc"];

/// A client of `server` over `transport` (one of [`TRANSPORTS`]).
pub fn client(server: &Server, transport: &str) -> Client {
    match transport {
        "grpc" => grpc_client(server),
        "inproc" => inproc_client(server),
        other => panic!("unknown transport {other}"),
    }
}

/// Inserts one step as one item per `(table, priority)` (as `Client.insert` does) and waits
/// until the server stored them, at most `timeout`; returns the items' keys.
pub fn insert_step(
    client: &Client,
    step: Vec<Tensor>,
    priorities: Vec<(String, f64)>,
    timeout: Option<Duration>,
) -> reverb_client::Result<Vec<u64>> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    Inserter::new(client.clone()).insert(&step, &priorities, deadline)
}
