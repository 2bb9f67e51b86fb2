//! Client against a real server on a localhost port.

use reverb_client::Tensor;

use crate::common::{block, client, insert_step, table, T, TRANSPORTS};
use reverb_core::SelectorKind;
use reverb_proto::tensorflow::DataType;
use reverb_server::{Server, ServerOptions};
use std::sync::Arc;
use std::time::Duration;

fn scalar_f32(v: f32) -> Tensor {
    Tensor::new(DataType::DtFloat as i32, vec![], v.to_le_bytes().to_vec()).unwrap()
}

#[test]
fn insert_sample_mutate_reset() {
    for transport in TRANSPORTS {
        let a = table("a", SelectorKind::Fifo, 10);
        let b = table("b", SelectorKind::Uniform, 10);
        let server = Server::start(vec![a.clone(), b.clone()], ServerOptions::default()).unwrap();
        let client = client(&server, transport);

        let vec3 = Tensor::new(
            DataType::DtInt32 as i32,
            vec![3],
            [1i32, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
        .unwrap();
        let keys = insert_step(
            &client,
            vec![scalar_f32(1.5), vec3.clone()],
            vec![("a".into(), 1.0), ("b".into(), 2.0)],
            T,
        )
        .unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!((a.size(), b.size()), (1, 1));
        // Both tables share the step's chunks.
        let (ia, _, _) = a.get(keys[0]).unwrap();
        let (ib, _, _) = b.get(keys[1]).unwrap();
        assert!(Arc::ptr_eq(&ia.chunks()[0], &ib.chunks()[0]));

        let samples = block(client.sample("a", 3, None, T)).unwrap();
        assert_eq!(samples.len(), 3);
        let s = &samples[0];
        assert_eq!(s.info.item.as_ref().unwrap().key, keys[0]);
        assert_eq!(s.columns[0].shape, vec![1]);
        assert_eq!(s.columns[0].data, 1.5f32.to_le_bytes().to_vec());
        assert_eq!(s.columns[1].shape, vec![1, 3]);
        assert_eq!(samples[2].info.item.as_ref().unwrap().times_sampled, 3);

        block(client.mutate_priorities("b", vec![(keys[1], 7.0)], vec![], T)).unwrap();
        assert_eq!(b.get(keys[1]).unwrap().1, 7.0);
        block(client.reset("a", T)).unwrap();
        assert_eq!(a.size(), 0);

        let infos = block(client.server_info(T)).unwrap();
        assert_eq!(
            infos.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            vec!["a", "b"]
        );

        let err = block(client.sample("nope", 1, None, T)).unwrap_err();
        assert_eq!(err.code, tonic::Code::NotFound);
        assert!(
            err.message.contains("nope") && err.message.contains("a, b"),
            "{}",
            err.message
        );
        let err = insert_step(
            &client,
            vec![scalar_f32(0.0)],
            vec![("nope".into(), 1.0)],
            T,
        )
        .unwrap_err();
        assert_eq!(err.code, tonic::Code::NotFound);
        // The failed insert did not disturb what is stored.
        assert_eq!(b.size(), 1);
    }
}

#[test]
fn rate_limiter_timeout_and_dead_server() {
    for transport in TRANSPORTS {
        let t = table("t", SelectorKind::Uniform, 10);
        let server = Server::start(vec![t], ServerOptions::default()).unwrap();
        let client = client(&server, transport);
        let err = block(client.sample("t", 1, Some(Duration::from_millis(50)), T)).unwrap_err();
        assert_eq!(err.code, tonic::Code::DeadlineExceeded);
        let err = block(client.sample("t", 1, None, Some(Duration::from_millis(200)))).unwrap_err();
        assert_eq!(err.code, tonic::Code::DeadlineExceeded);
        server.stop();
        let started = std::time::Instant::now();
        let err = block(client.server_info(Some(Duration::from_secs(3)))).unwrap_err();
        assert!(
            matches!(
                err.code,
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
            ),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(4));
    }
}
