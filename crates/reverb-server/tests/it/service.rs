//! The unary RPCs as a client sees them over the wire: `ServerInfo`, `MutatePriorities`,
//! `Reset`, `Checkpoint` (without a checkpointer), and `InitializeConnection`.

use crate::common::*;
use bytes::Bytes;
use reverb_core::{SelectorKind, Table, TableConfig};
use reverb_proto::key_distribution_options::{Distribution, Prioritized};
use reverb_proto::{
    CheckpointRequest, InitializeConnectionRequest, KeyWithPriority, MutatePrioritiesRequest,
    ResetRequest,
};
use std::sync::Arc;
use tonic::Code;

fn mutate(table: &str, updates: &[(u64, f64)], deletes: &[u64]) -> MutatePrioritiesRequest {
    MutatePrioritiesRequest {
        table: table.into(),
        updates: updates
            .iter()
            .map(|&(key, priority)| KeyWithPriority { key, priority })
            .collect(),
        delete_keys: deletes.to_vec(),
    }
}

fn prioritized(name: &str) -> Arc<Table> {
    let exponent_one = SelectorKind::Prioritized {
        priority_exponent: 1.0,
    };
    table(name, exponent_one, 10, 0, min_size(1))
}

#[tokio::test]
async fn server_info_describes_every_table() {
    // Opaque to the server: any bytes come back as they are.
    let signature = Bytes::from_static(b"\x0a\x02\x08\x01 any StructuredValue bytes");
    let a = Arc::new(
        Table::new(TableConfig {
            name: "a".into(),
            sampler: SelectorKind::Fifo,
            remover: SelectorKind::Fifo,
            max_size: 10,
            max_times_sampled: 1,
            rate_limiter: queue_limiter(10),
            signature: Some(signature.clone()),
        })
        .unwrap(),
    );
    let b = table(
        "b",
        SelectorKind::Prioritized {
            priority_exponent: 0.8,
        },
        100,
        0,
        min_size(2),
    );
    // Given out of order: listed by name.
    let (stub, _) = serve(vec![b, a]).await;
    let first = server_info_response(&stub).await;
    let names: Vec<&str> = first.table_info.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    let (a, b) = (&first.table_info[0], &first.table_info[1]);

    assert_eq!((a.max_size, a.max_times_sampled), (10, 1));
    assert_eq!(a.signature, signature);
    let sampler = a.sampler_options.as_ref().unwrap();
    assert_eq!(sampler.distribution, Some(Distribution::Fifo(true)));
    assert!(sampler.is_deterministic);
    let limiter = a.rate_limiter_info.as_ref().unwrap();
    assert_eq!(
        (
            limiter.samples_per_insert,
            limiter.min_size_to_sample,
            limiter.min_diff,
            limiter.max_diff
        ),
        (1.0, 1, 0.0, 10.0)
    );

    assert_eq!((b.max_size, b.max_times_sampled), (100, 0));
    assert!(b.signature.is_empty(), "no signature: empty bytes");
    let sampler = b.sampler_options.as_ref().unwrap();
    assert_eq!(
        sampler.distribution,
        Some(Distribution::Prioritized(Prioritized {
            priority_exponent: 0.8
        }))
    );
    assert!(!sampler.is_deterministic);
    assert_eq!(
        b.remover_options.as_ref().unwrap().distribution,
        Some(Distribution::Fifo(true))
    );
    assert_eq!(b.rate_limiter_info.as_ref().unwrap().min_size_to_sample, 2);

    // Sizes and episodes follow inserts; the state id stays.
    insert(&stub, "b", &[(1, 1.0), (2, 1.0)]).await;
    let second = server_info_response(&stub).await;
    assert!(first.tables_state_id.is_some());
    assert_eq!(second.tables_state_id, first.tables_state_id);
    let b = &second.table_info[1];
    assert_eq!((b.current_size, b.num_episodes), (2, 2));
    assert_eq!(second.table_info[0].current_size, 0);
}

#[tokio::test]
async fn mutate_priorities_updates_and_deletes_and_ignores_unknown_keys() {
    let (stub, _) = serve(vec![prioritized("t")]).await;
    insert(&stub, "t", &[(1, 1.0), (2, 1.0), (3, 1.0)]).await;
    stub.clone()
        .mutate_priorities(mutate("t", &[(2, 2.0), (99, 5.0)], &[3, 98]))
        .await
        .unwrap();
    assert_eq!(size(&stub, "t").await, 2);
    // Weights 1 and 2, whichever key each sample draws.
    for sample in sample(&stub, "t", 8, Some(1000)).await.unwrap() {
        let (priority, probability) = match sample.key() {
            1 => (1.0, 1.0 / 3.0),
            2 => (2.0, 2.0 / 3.0),
            other => panic!("key {other} should be gone"),
        };
        assert_eq!(sample.item().priority, priority);
        assert!((sample.info.probability - probability).abs() < 1e-9);
    }
}

#[tokio::test]
async fn mutate_priorities_deletes_before_it_updates() {
    let (stub, _) = serve(vec![prioritized("t")]).await;
    insert(&stub, "t", &[(1, 1.0), (2, 1.0)]).await;
    stub.clone()
        .mutate_priorities(mutate("t", &[(1, 4.0)], &[1]))
        .await
        .unwrap();
    assert_eq!(size(&stub, "t").await, 1);
    let samples = sample(&stub, "t", 1, Some(1000)).await.unwrap();
    assert_eq!((samples[0].key(), samples[0].info.probability), (2, 1.0));
}

#[tokio::test]
async fn mutate_priorities_with_a_bad_priority_changes_nothing() {
    let (stub, _) = serve(vec![prioritized("t")]).await;
    insert(&stub, "t", &[(1, 1.0), (2, 1.0), (3, 1.0)]).await;
    let status = stub
        .clone()
        .mutate_priorities(mutate("t", &[(1, 5.0), (2, f64::NAN)], &[3]))
        .await
        .unwrap_err();
    assert_status(&status, Code::InvalidArgument, &["NaN", "'t'"]);
    assert_eq!(size(&stub, "t").await, 3, "the delete was not applied");
    for sample in sample(&stub, "t", 6, Some(1000)).await.unwrap() {
        assert_eq!(sample.item().priority, 1.0, "no update was applied");
    }
}

#[tokio::test]
async fn calls_on_an_unknown_table_are_not_found_and_list_the_tables() {
    let (stub, _) = serve(vec![prioritized("t"), prioritized("u")]).await;
    let status = stub
        .clone()
        .mutate_priorities(mutate("nope", &[(1, 1.0)], &[]))
        .await
        .unwrap_err();
    assert_status(
        &status,
        Code::NotFound,
        &["Priority table nope was not found", "[t, u]"],
    );
    let status = stub
        .clone()
        .reset(ResetRequest {
            table: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_status(
        &status,
        Code::NotFound,
        &["Priority table nope was not found", "[t, u]"],
    );
}

#[tokio::test]
async fn reset_empties_one_table_and_zeroes_its_counters() {
    // Three inserts fill the limiter until items are sampled.
    let t = table("t", SelectorKind::Fifo, 10, 0, queue_limiter(3));
    let other = table("other", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t, other]).await;
    insert(&stub, "t", &[(1, 1.0), (2, 1.0), (3, 1.0)]).await;
    insert(&stub, "other", &[(1, 1.0)]).await;
    sample(&stub, "t", 2, Some(1000)).await.unwrap();
    assert_eq!(completed(&stub, "t").await, (3, 2));

    stub.clone()
        .reset(ResetRequest { table: "t".into() })
        .await
        .unwrap();
    let info = table_info(&stub, "t").await;
    assert_eq!(
        (
            info.current_size,
            info.num_episodes,
            info.num_deleted_episodes,
            info.num_unique_samples
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(completed(&stub, "t").await, (0, 0));
    assert_eq!(size(&stub, "other").await, 1, "other tables are untouched");

    // The rate limiter starts over: three inserts go ahead again without a sample (with the
    // old counters, 3 inserts and 2 samples, the third would wait).
    assert_eq!(
        insert(&stub, "t", &[(4, 1.0), (5, 1.0), (6, 1.0)]).await,
        [4, 5, 6]
    );
    let samples = sample(&stub, "t", 1, Some(1000)).await.unwrap();
    assert_eq!((samples[0].key(), samples[0].info.table_size), (4, 3));
}

#[tokio::test]
async fn checkpoint_without_a_checkpointer_is_an_invalid_argument() {
    let (stub, _) = serve(vec![prioritized("t")]).await;
    let status = stub
        .clone()
        .checkpoint(CheckpointRequest {})
        .await
        .unwrap_err();
    assert_status(&status, Code::InvalidArgument, &["checkpointer"]);
}

#[tokio::test]
async fn initialize_connection_answers_address_zero() {
    let (stub, _) = serve(vec![prioritized("t")]).await;
    let request = InitializeConnectionRequest {
        pid: i64::from(std::process::id()),
        table_name: "t".into(),
        ownership_transferred: false,
    };
    let mut responses = stub
        .clone()
        .initialize_connection(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.message().await.unwrap().unwrap();
    assert_eq!(
        response.address, 0,
        "use gRPC: no table pointer is handed out"
    );
    assert!(responses.message().await.unwrap().is_none());
}
