//! The trajectory writer's insert stream against a real server, over gRPC and in-process:
//! items arrive in order with their rows and shared chunks, a full in-flight window waits
//! and resumes, unconfirmed items reach a restarted server, and failures are reported.

use reverb_client::writer::{ItemColumn, TrajectoryWriter, WriterOptions};
use reverb_client::{Client, Tensor};

use crate::common::{block, blocking_queue, client, queue, T, TRANSPORTS};
use reverb_core::Table;
use reverb_proto::tensorflow::DataType;
use reverb_server::{Server, ServerOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Code;

fn int64(v: i64) -> Tensor {
    Tensor::new(DataType::DtInt64 as i32, vec![], v.to_le_bytes().to_vec()).unwrap()
}

/// A column of the steps `steps` of writer column 0.
fn steps(steps: &[u64]) -> Vec<ItemColumn> {
    vec![ItemColumn {
        refs: steps.iter().map(|&s| (0, s)).collect(),
        squeeze: false,
    }]
}

fn soon() -> Option<Instant> {
    Some(Instant::now() + Duration::from_secs(10))
}

fn writer(client: &Client, options: WriterOptions) -> TrajectoryWriter {
    let _guard = reverb_client::runtime().enter();
    TrajectoryWriter::new(client.clone(), options).unwrap()
}

/// The int64 rows of the next `n` items of a queue, in order.
fn drain(client: &Client, table: &str, n: usize) -> Vec<Vec<i64>> {
    let samples = block(client.sample(table, n, None, T)).unwrap();
    samples
        .iter()
        .map(|s| {
            s.columns[0]
                .data
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect()
        })
        .collect()
}

#[test]
fn items_arrive_in_order_with_their_rows_and_shared_chunks() {
    for transport in TRANSPORTS {
        let q = queue("q", 1000);
        let server = Server::start(vec![q.clone()], ServerOptions::default()).unwrap();
        let client = client(&server, transport);
        let options = WriterOptions {
            num_keep_alive_refs: 3,
            ..WriterOptions::default()
        };
        let mut w = writer(&client, options);
        let mut keys = Vec::new();
        for t in 0..20u64 {
            w.append(vec![(0, int64(t as i64 * 10))], false).unwrap();
            if t >= 1 {
                keys.push(
                    w.create_item("q", 1.0, &steps(&[t - 1, t]), soon())
                        .unwrap()
                        .0,
                );
            }
        }
        w.end_episode(true);
        assert!(w.flush(0, soon()).unwrap(), "{transport}");
        assert_eq!(w.unconfirmed(), 0, "{transport}");
        assert_eq!(q.size(), 19, "{transport}");
        // Items of overlapping steps share the chunk that holds the common step.
        let (first, _, _) = q.get(keys[0]).unwrap();
        let (second, _, _) = q.get(keys[1]).unwrap();
        assert!(
            first
                .chunks()
                .iter()
                .any(|a| second.chunks().iter().any(|b| Arc::ptr_eq(a, b))),
            "{transport}: no shared chunk"
        );
        let got = drain(&client, "q", 19);
        let want: Vec<Vec<i64>> = (1..20).map(|t| vec![(t - 1) * 10, t * 10]).collect();
        assert_eq!(got, want, "{transport}");
    }
}

#[test]
fn a_full_in_flight_window_waits_and_resumes_as_the_server_takes_items() {
    for transport in TRANSPORTS {
        // Inserts block once the queue holds 2 items; the writer keeps at most 2 unconfirmed.
        let q = blocking_queue("q", 2);
        let server = Server::start(vec![q.clone()], ServerOptions::default()).unwrap();
        let client = client(&server, transport);
        let options = WriterOptions {
            max_in_flight_items: 2,
            ..WriterOptions::default()
        };
        let mut w = writer(&client, options);
        let mut stopped_waiting = false;
        for t in 0..8u64 {
            w.append(vec![(0, int64(t as i64))], false).unwrap();
            let short = Some(Instant::now() + Duration::from_millis(20));
            let (_, sent) = w.create_item("q", 1.0, &steps(&[t]), short).unwrap();
            stopped_waiting |= !sent;
        }
        assert!(stopped_waiting, "{transport}: the window never filled");
        assert!(q.size() <= 2, "{transport}");
        // Taking items makes room: everything arrives, in order.
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while got.len() < 8 {
            assert!(Instant::now() < deadline, "{transport}: stalled at {got:?}");
            w.send_ready(Some(Instant::now() + Duration::from_millis(10)))
                .unwrap();
            if q.size() > 0 {
                got.extend(drain(&client, "q", 1).into_iter().flatten());
            }
            let _ = w.flush(0, Some(Instant::now() + Duration::from_millis(10)));
        }
        assert_eq!(got, (0..8).collect::<Vec<i64>>(), "{transport}");
        assert!(w.flush(0, soon()).unwrap(), "{transport}");
    }
}

#[test]
fn unconfirmed_items_reach_a_restarted_server() {
    for transport in TRANSPORTS {
        let server = Server::start(vec![queue("q", 100)], ServerOptions::default()).unwrap();
        let port = server.port();
        let client = client(&server, transport);
        let options = WriterOptions {
            reconnect_timeout: Duration::from_secs(20),
            ..WriterOptions::default()
        };
        let mut w = writer(&client, options);
        w.append(vec![(0, int64(1))], false).unwrap();
        w.create_item("q", 1.0, &steps(&[0]), soon()).unwrap();
        assert!(w.flush(0, soon()).unwrap(), "{transport}");
        server.stop();
        // Created while the server is down: queued, sent, unconfirmed.
        w.append(vec![(0, int64(2))], false).unwrap();
        w.create_item("q", 1.0, &steps(&[1]), soon()).unwrap();
        assert!(!w
            .flush(0, Some(Instant::now() + Duration::from_millis(200)))
            .unwrap());
        let fresh: Arc<Table> = queue("q", 100);
        let restarted = Server::start(
            vec![fresh.clone()],
            ServerOptions {
                port,
                ..ServerOptions::default()
            },
        )
        .unwrap();
        assert!(
            w.flush(0, soon()).unwrap(),
            "{transport}: never reconnected"
        );
        assert_eq!(
            fresh.size(),
            1,
            "{transport}: only the unconfirmed item is resent"
        );
        let again = crate::common::client(&restarted, transport);
        assert_eq!(drain(&again, "q", 1), vec![vec![2]], "{transport}");
    }
}

/// Flushes until everything is settled; the errors met on the way.
fn flush_all(w: &mut TrajectoryWriter) -> Vec<reverb_client::ClientError> {
    let mut errors = Vec::new();
    for _ in 0..10 {
        match w.flush(0, soon()) {
            Ok(true) => return errors,
            Ok(false) => panic!("flush timed out"),
            Err(e) => errors.push(e),
        }
    }
    panic!("flush kept failing: {errors:?}");
}

#[test]
fn a_refused_item_is_reported_once_and_the_writer_goes_on() {
    for transport in TRANSPORTS {
        let q = queue("q", 10);
        let server = Server::start(vec![q.clone()], ServerOptions::default()).unwrap();
        let client = client(&server, transport);
        let mut w = writer(&client, WriterOptions::default());
        // Created together, the three items leave in one request; only the bad one is dropped.
        for (t, table) in ["q", "nope", "q"].into_iter().enumerate() {
            w.append(vec![(0, int64(t as i64))], false).unwrap();
            w.create_item(table, 1.0, &steps(&[t as u64]), soon())
                .unwrap();
        }
        let errors = flush_all(&mut w);
        assert_eq!(errors.len(), 1, "{transport}: {errors:?}");
        assert_eq!(errors[0].code, Code::NotFound, "{transport}: {errors:?}");
        assert!(errors[0].message.contains("nope"), "{transport}");
        assert!(!w.failed(), "{transport}");
        // Later items go through as if nothing happened.
        w.append(vec![(0, int64(3))], false).unwrap();
        w.create_item("q", 1.0, &steps(&[3]), soon()).unwrap();
        assert!(flush_all(&mut w).is_empty(), "{transport}");
        assert_eq!(w.unconfirmed(), 0, "{transport}");
        assert_eq!(
            drain(&client, "q", 3),
            vec![vec![0], vec![2], vec![3]],
            "{transport}"
        );
        // A refusal is raised by the next call before it changes anything: here an append,
        // which appends nothing; the same append then goes through. (The item may already
        // leave with `create_item`, and its refusal come back before `send_ready` returns:
        // then `send_ready` is the call that reports it, once.)
        w.append(vec![(0, int64(4))], false).unwrap();
        w.create_item("nope", 1.0, &steps(&[4]), soon()).unwrap();
        let reported = match w.send_ready(soon()) {
            Ok(_) => false,
            Err(e) => {
                assert_eq!(e.code, Code::NotFound, "{transport}: {e:?}");
                true
            }
        };
        let until = Instant::now() + Duration::from_secs(10);
        while w.unconfirmed() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !reported {
            let err = w.append(vec![(0, int64(5))], false).unwrap_err();
            assert!(
                format!("{err:?}").contains("NotFound"),
                "{transport}: {err:?}"
            );
        }
        w.append(vec![(0, int64(5))], false).unwrap();
        w.create_item("q", 1.0, &steps(&[5]), soon()).unwrap();
        assert!(flush_all(&mut w).is_empty(), "{transport}");
        assert_eq!(drain(&client, "q", 1), vec![vec![5]], "{transport}");
    }
}

/// Bytes snappy cannot shrink, as an int64 tensor of `n` values.
fn incompressible(n: usize) -> Tensor {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let data = (0..n)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    Tensor::new(DataType::DtInt64 as i32, vec![n as i64], data).unwrap()
}

#[test]
fn an_item_over_the_message_limit_fails_fast_and_the_writer_goes_on() {
    let q = queue("q", 10);
    let server = Server::start(vec![q.clone()], ServerOptions::default()).unwrap();
    let client = crate::common::grpc_client(&server).with_max_message_size(64 << 10);
    let mut w = writer(&client, WriterOptions::default());
    w.append(vec![(0, incompressible(16 << 10))], false)
        .unwrap();
    w.create_item("q", 1.0, &steps(&[0]), soon()).unwrap();
    let started = Instant::now();
    let errors = flush_all(&mut w);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].code, Code::InvalidArgument);
    assert!(
        errors[0].message.contains("65536 bytes a message may hold"),
        "{}",
        errors[0].message
    );
    // Items of a smaller column still go through.
    w.append(vec![(1, int64(7))], false).unwrap();
    let small = [ItemColumn {
        refs: vec![(1, 1)],
        squeeze: false,
    }];
    w.create_item("q", 1.0, &small, soon()).unwrap();
    assert!(flush_all(&mut w).is_empty());
    assert_eq!(q.size(), 1);
}

#[test]
fn a_server_with_a_smaller_message_limit_refuses_the_item_not_the_writer() {
    let q = queue("q", 10);
    let options = ServerOptions {
        max_message_size: 64 << 10,
        ..ServerOptions::default()
    };
    let server = Server::start(vec![q.clone()], options).unwrap();
    let client = crate::common::grpc_client(&server);
    let mut w = writer(&client, WriterOptions::default());
    w.append(vec![(0, incompressible(16 << 10))], false)
        .unwrap();
    w.create_item("q", 1.0, &steps(&[0]), soon()).unwrap();
    let started = Instant::now();
    let errors = flush_all(&mut w);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].message.contains("65536"), "{:?}", errors[0]);
    w.append(vec![(1, int64(7))], false).unwrap();
    let small = [ItemColumn {
        refs: vec![(1, 1)],
        squeeze: false,
    }];
    w.create_item("q", 1.0, &small, soon()).unwrap();
    assert!(flush_all(&mut w).is_empty());
    assert_eq!(q.size(), 1);
}

#[test]
fn a_stopped_server_fails_the_writer_within_its_reconnect_timeout() {
    for transport in TRANSPORTS {
        let server = Server::start(vec![queue("q", 10)], ServerOptions::default()).unwrap();
        let client = client(&server, transport);
        let options = WriterOptions {
            reconnect_timeout: Duration::from_millis(300),
            ..WriterOptions::default()
        };
        let mut w = writer(&client, options);
        server.stop();
        let started = Instant::now();
        w.append(vec![(0, int64(1))], false).unwrap();
        w.create_item("q", 1.0, &steps(&[0]), soon()).unwrap();
        let err = w.flush(0, soon()).unwrap_err();
        assert_eq!(err.code, Code::Unavailable, "{transport}: {err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{transport}: took {:?}",
            started.elapsed()
        );
    }
}
