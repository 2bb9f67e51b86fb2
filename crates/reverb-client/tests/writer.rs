//! The native trajectory writer against a real server: oversized items get a clear error and
//! nothing stored is lost.

use reverb_client::writer::{ItemColumn, TrajectoryWriter, WriterOptions};
use reverb_client::Tensor;
mod common;

use common::{grpc_client, table};
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
    writer.append(vec![(0, bytes_row(1000, 1))], false).unwrap();
    let column = |step| {
        vec![ItemColumn {
            refs: vec![(0, step)],
            squeeze: true,
        }]
    };
    writer
        .create_item("t", 1.0, &column(0), deadline())
        .unwrap();
    assert!(writer.flush(0, deadline()).unwrap());
    assert_eq!(t.size(), 1);

    // Then one whose chunk (2 MiB) exceeds the server's 1 MiB message limit.
    let mut big = TrajectoryWriter::new(writer.client().clone(), WriterOptions::default()).unwrap();
    big.append(vec![(0, bytes_row(2 << 20, 2))], false).unwrap();
    big.create_item("t", 1.0, &column(0), deadline()).unwrap();
    let err = big.flush(0, deadline()).unwrap_err();
    assert!(
        err.message.contains("too large") || err.message.contains("limit"),
        "{err:?}"
    );
    assert_eq!(t.size(), 1, "what was stored before is still there");
    // The server keeps serving others.
    writer.append(vec![(0, bytes_row(1000, 3))], false).unwrap();
    writer
        .create_item("t", 1.0, &column(1), deadline())
        .unwrap();
    assert!(writer.flush(0, deadline()).unwrap());
    assert_eq!(t.size(), 2);
}
