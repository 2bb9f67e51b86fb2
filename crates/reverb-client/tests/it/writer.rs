//! The native trajectory writer against a real server: oversized items get a clear error and
//! nothing stored is lost.

use reverb_client::writer::{ItemColumn, TrajectoryWriter, WriterOptions};
use reverb_client::Tensor;

use crate::common::{grpc_client, table};
use reverb_core::SelectorKind;
use reverb_proto::tensorflow::DataType;
use reverb_server::{Server, ServerOptions};
use std::time::{Duration, Instant};

fn bytes_row(n: usize, seed: u8) -> Tensor {
    // Incompressible-ish bytes, so snappy cannot shrink the chunk under the limit.
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(seed);
    let data = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    Tensor::new(DataType::DtUint8 as i32, vec![n as i64], data).unwrap()
}

/// An item column of the one row column 0 got at `step`.
fn row_at(step: u64) -> Vec<ItemColumn> {
    vec![ItemColumn {
        refs: vec![(0, step)],
        squeeze: true,
    }]
}

/// Appends `row` as the writer's step `step`, makes an item of it in table "t" and flushes:
/// whether the server confirmed every item before `deadline`.
fn store(writer: &mut TrajectoryWriter, row: Tensor, step: u64, deadline: Option<Instant>) -> bool {
    writer.append(vec![(0, row)], false).unwrap();
    writer
        .create_item("t", 1.0, &row_at(step), deadline)
        .unwrap();
    writer.flush(0, deadline).unwrap()
}

#[test]
fn an_item_larger_than_the_server_accepts_fails_clearly() {
    let t = table("t", SelectorKind::Fifo, 100);
    let options = ServerOptions {
        max_message_size: 1 << 20,
        ..ServerOptions::default()
    };
    let server = Server::start(vec![t.clone()], options).unwrap();
    let client = grpc_client(&server);
    let mut writer = TrajectoryWriter::new(client, WriterOptions::default()).unwrap();
    let deadline = || Some(Instant::now() + Duration::from_secs(10));

    // A small item first: stored.
    assert!(store(&mut writer, bytes_row(1000, 1), 0, deadline()));
    assert_eq!(t.size(), 1);

    // Then one whose chunk (2 MiB) exceeds the server's 1 MiB message limit.
    let mut big = TrajectoryWriter::new(writer.client().clone(), WriterOptions::default()).unwrap();
    big.append(vec![(0, bytes_row(2 << 20, 2))], false).unwrap();
    big.create_item("t", 1.0, &row_at(0), deadline()).unwrap();
    let err = big.flush(0, deadline()).unwrap_err();
    assert!(
        err.message.contains("too large") || err.message.contains("limit"),
        "{err:?}"
    );
    assert_eq!(t.size(), 1, "what was stored before is still there");
    // The server keeps serving others.
    assert!(store(&mut writer, bytes_row(1000, 3), 1, deadline()));
    assert_eq!(t.size(), 2);
}

/// Established TCP connections to `port` in this network namespace (client ends; from /proc).
fn connections_to(port: u16) -> usize {
    ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|text| {
            text.lines()
                .skip(1)
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let remote_port = fields[2].rsplit(':').next().unwrap();
                    u16::from_str_radix(remote_port, 16) == Ok(port) && fields[3] == "01"
                })
                .count()
        })
        .sum()
}

#[test]
fn a_clients_writers_share_one_connection_of_their_own() {
    let t = table("t", SelectorKind::Fifo, 100);
    let server = Server::start(vec![t.clone()], ServerOptions::default()).unwrap();
    let client = grpc_client(&server);
    let deadline = || Some(Instant::now() + Duration::from_secs(10));
    let mut writers: Vec<TrajectoryWriter> = (0..3)
        .map(|_| TrajectoryWriter::new(client.clone(), WriterOptions::default()).unwrap())
        .collect();
    for (i, writer) in writers.iter_mut().enumerate() {
        assert!(store(writer, bytes_row(100, i as u8), 0, deadline()));
    }
    assert_eq!(t.size(), 3);
    assert_eq!(connections_to(server.port()), 1, "the writers' connection");
    // Other calls use the client's own connection.
    crate::common::block(client.server_info(Some(Duration::from_secs(10)))).unwrap();
    assert_eq!(connections_to(server.port()), 2, "and the client's");
    // A writer made from a writer's client shares the first writers' connection.
    let mut more =
        TrajectoryWriter::new(writers[0].client().clone(), WriterOptions::default()).unwrap();
    assert!(store(&mut more, bytes_row(100, 9), 0, deadline()));
    assert_eq!(t.size(), 4);
    assert_eq!(connections_to(server.port()), 2);
}

#[test]
fn writers_keep_writing_while_the_shared_runtime_is_busy() {
    // Writers, and the connection they use, run on a runtime of their own: a shared runtime
    // whose workers are all busy (here: blocked) does not hold them up.
    let t = table("t", SelectorKind::Fifo, 100);
    let server = Server::start(vec![t.clone()], ServerOptions::default()).unwrap();
    let client = grpc_client(&server);
    let deadline = || Some(Instant::now() + Duration::from_secs(1));
    let mut writer = TrajectoryWriter::new(client.clone(), WriterOptions::default()).unwrap();
    assert!(store(&mut writer, bytes_row(100, 1), 0, deadline()));

    // Every worker of the shared runtime sleeps for 3 s.
    let workers = reverb_client::runtime().metrics().num_workers();
    let started = std::sync::Arc::new(std::sync::Barrier::new(workers + 1));
    let sleepers: Vec<_> = (0..workers)
        .map(|_| {
            let started = started.clone();
            reverb_client::runtime().spawn(async move {
                started.wait();
                std::thread::sleep(Duration::from_secs(3));
            })
        })
        .collect();
    started.wait();

    let start = Instant::now();
    for step in 1..=20u8 {
        writer
            .append(vec![(0, bytes_row(100, step))], false)
            .unwrap();
        writer
            .create_item("t", 1.0, &row_at(u64::from(step)), deadline())
            .unwrap();
    }
    assert!(writer.flush(0, deadline()).unwrap(), "flushed within 1 s");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_eq!(t.size(), 21);
    for sleeper in sleepers {
        crate::common::block(sleeper).unwrap();
    }
}
