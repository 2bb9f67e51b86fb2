//! `InsertStream` as a client sees it over the wire: chunks then items, confirmations,
//! `keep_chunk_keys`, refused requests (and that nothing of them is stored), rate-limiter
//! waits and cancellation.

use crate::common::*;
use bytes::Bytes;
use reverb_core::{SelectorKind, Waiter};
use reverb_proto::{InsertStreamRequest, ItemRun};
use tonic::Code;

#[tokio::test]
async fn chunks_then_items_are_stored_and_confirmed_with_their_keys() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let mut stream = InsertStream::open(&stub).await;
    // Two items over one three-row chunk of episode 10.
    let sent_chunk = chunk(1, 10, 3);
    let first = item(100, "t", 1.5, 1, 0, 2);
    let second = item(101, "t", 2.5, 1, 1, 2);
    let keys = stream
        .insert(request(
            vec![sent_chunk.clone()],
            &[first.clone(), second.clone()],
            vec![],
        ))
        .await;
    assert_eq!(keys, [100, 101]);

    let info = table_info(&stub, "t").await;
    assert_eq!(info.current_size, 2);
    assert_eq!(info.num_episodes, 1);
    assert_eq!(completed(&stub, "t").await, (2, 0));
    // Each comes back as it was sent, with the chunk it references, stamped by the table.
    let samples = sample(&stub, "t", 1, Some(1000)).await.unwrap();
    let got = samples[0].item();
    assert_eq!(got.key, 100);
    assert_eq!(got.table, "t");
    assert_eq!(got.priority, 1.5);
    assert_eq!(got.flat_trajectory, first.flat_trajectory);
    assert!(got.inserted_at.is_some(), "the table stamps inserted_at");
    assert_eq!(samples[0].chunks, [sent_chunk]);
}

#[tokio::test]
async fn a_request_of_chunks_only_is_not_confirmed_and_its_chunks_serve_later_items() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let mut stream = InsertStream::open(&stub).await;
    stream
        .send(request(vec![chunk(5, 1, 1)], &[], vec![]))
        .await;
    stream
        .send(request(vec![], &[item(50, "t", 1.0, 5, 0, 1)], vec![]))
        .await;
    // Answers come in order: the first one is the item's.
    assert_eq!(stream.confirmed().await, [50]);
    assert_eq!(size(&stub, "t").await, 1);
}

#[tokio::test]
async fn after_items_the_stream_keeps_only_the_chunks_it_is_asked_to_keep() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let mut stream = InsertStream::open(&stub).await;
    let first = request(
        vec![chunk(1, 1, 1), chunk(2, 1, 1)],
        &[item(10, "t", 1.0, 1, 0, 1)],
        vec![2],
    );
    assert_eq!(stream.insert(first).await, [10]);
    // Chunk 2 was kept; this request keeps nothing.
    let second = request(vec![], &[item(20, "t", 1.0, 2, 0, 1)], vec![]);
    assert_eq!(stream.insert(second).await, [20]);
    let third = request(vec![], &[item(30, "t", 1.0, 2, 0, 1)], vec![]);
    let status = stream.refused(third).await;
    assert_status(
        &status,
        Code::InvalidArgument,
        &["Could not find sequence chunk 2", "item 30"],
    );
    assert_eq!(size(&stub, "t").await, 2);
}

#[tokio::test]
async fn an_item_referencing_an_unknown_chunk_is_refused_and_nothing_of_its_request_stored() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let mut stream = InsertStream::open(&stub).await;
    // The first item is good: it must not be stored either.
    let status = stream
        .refused(request(
            vec![chunk(1, 1, 1)],
            &[item(10, "t", 1.0, 1, 0, 1), item(11, "t", 1.0, 99, 0, 1)],
            vec![],
        ))
        .await;
    assert_status(
        &status,
        Code::InvalidArgument,
        &["Could not find sequence chunk 99", "item 11"],
    );
    let info = table_info(&stub, "t").await;
    assert_eq!((info.current_size, info.num_episodes), (0, 0));
    assert_eq!(completed(&stub, "t").await, (0, 0));
}

#[tokio::test]
async fn an_item_for_an_unknown_table_is_not_found_and_nothing_of_its_request_stored() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let mut stream = InsertStream::open(&stub).await;
    let status = stream
        .refused(request(
            vec![chunk(1, 1, 1)],
            &[item(10, "t", 1.0, 1, 0, 1), item(11, "nope", 1.0, 1, 0, 1)],
            vec![],
        ))
        .await;
    assert_status(
        &status,
        Code::NotFound,
        &["Priority table nope was not found", "[t]"],
    );
    assert_eq!(size(&stub, "t").await, 0);
    assert_eq!(completed(&stub, "t").await, (0, 0));
}

#[tokio::test]
async fn malformed_requests_are_invalid_arguments_naming_the_problem() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let good_chunk = || vec![chunk(1, 1, 3)];
    let mut no_trajectory = item(10, "t", 1.0, 1, 0, 1);
    no_trajectory.flat_trajectory = None;
    let mut squeezed = item(12, "t", 1.0, 1, 0, 2);
    squeezed.flat_trajectory.as_mut().unwrap().columns[0].squeeze = true;
    let mut bad_payload = chunk(2, 1, 1);
    bad_payload.data = Bytes::from_static(b"\x0a\x03abc");
    let cases: Vec<(&str, InsertStreamRequest, Vec<&str>)> = vec![
        (
            "an empty request",
            InsertStreamRequest::default(),
            vec!["at least one chunk or item"],
        ),
        (
            "an item that does not decode",
            InsertStreamRequest {
                chunks: good_chunk(),
                // Field 1 (the key) as a varint, cut short.
                items: vec![Bytes::from_static(b"\x08\xff")],
                keep_chunk_keys: vec![],
                item_runs: Vec::new(),
            },
            vec!["An item could not be decoded"],
        ),
        (
            "an item without a trajectory",
            request(good_chunk(), &[no_trajectory], vec![]),
            vec!["Item 10 has no flat_trajectory"],
        ),
        (
            "a slice past its chunk's rows",
            request(good_chunk(), &[item(11, "t", 1.0, 1, 2, 2)], vec![]),
            vec!["item 11", "rows 2..4 of chunk 1", "has 3 rows"],
        ),
        (
            "a squeezed column of two rows",
            request(good_chunk(), &[squeezed], vec![]),
            vec!["item 12", "squeezed"],
        ),
        (
            "a NaN priority",
            request(good_chunk(), &[item(13, "t", f64::NAN, 1, 0, 1)], vec![]),
            vec!["NaN", "'t'"],
        ),
        (
            "a chunk whose payload is not tensors",
            request(vec![bad_payload], &[], vec![]),
            vec!["Chunk 2", "malformed payload"],
        ),
    ];
    for (what, request, words) in cases {
        let mut stream = InsertStream::open(&stub).await;
        let status = stream.refused(request).await;
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        for word in words {
            assert!(
                status.message().contains(word),
                "{what}: {:?} does not mention {word:?}",
                status.message()
            );
        }
    }
    assert_eq!(size(&stub, "t").await, 0);
    assert_eq!(insert(&stub, "t", &[(1, 1.0)]).await, [1]);
}

#[tokio::test]
async fn a_refused_stream_leaves_other_streams_and_connections_serving() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, connector) = serve(vec![t]).await;
    let mut open = InsertStream::open(&stub).await;
    let one = |key| {
        request(
            vec![chunk(key, key, 1)],
            &[item(key, "t", 1.0, key, 0, 1)],
            vec![],
        )
    };
    assert_eq!(open.insert(one(1)).await, [1]);

    let mut failing = InsertStream::open(&stub).await;
    let status = failing
        .refused(request(vec![], &[item(9, "t", 1.0, 404, 0, 1)], vec![]))
        .await;
    assert_eq!(status.code(), Code::InvalidArgument);
    // The refused stream is over; the other one, and new connections, carry on.
    assert!(failing.next().await.unwrap().is_none());
    assert_eq!(open.insert(one(2)).await, [2]);
    let other = connector.connect().await;
    assert_eq!(insert(&other, "t", &[(3, 1.0)]).await, [3]);
    assert_eq!(size(&stub, "t").await, 3);
}

#[tokio::test]
async fn an_existing_key_only_has_its_priority_updated() {
    let t = table("t", SelectorKind::MaxHeap, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    assert_eq!(insert(&stub, "t", &[(1, 1.0), (2, 2.0)]).await, [1, 2]);
    // Key 1 again (with a chunk of its own), at a higher priority: confirmed, not added.
    assert_eq!(insert(&stub, "t", &[(1, 3.0)]).await, [1]);
    assert_eq!(size(&stub, "t").await, 2);
    assert_eq!(completed(&stub, "t").await, (2, 0));
    let samples = sample(&stub, "t", 1, Some(1000)).await.unwrap();
    assert_eq!(
        (samples[0].key(), samples[0].item().priority),
        (1, 3.0),
        "the max-heap picks key 1 at its new priority"
    );
}

#[tokio::test]
async fn an_insert_past_max_size_evicts_with_the_remover_after_inserting() {
    let t = table("t", SelectorKind::Fifo, 2, 1, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    assert_eq!(
        insert(&stub, "t", &[(1, 1.0), (2, 1.0), (3, 1.0)]).await,
        [1, 2, 3]
    );
    let info = table_info(&stub, "t").await;
    assert_eq!(info.current_size, 2);
    // Each item is its own episode: the oldest one went with item 1.
    assert_eq!((info.num_episodes, info.num_deleted_episodes), (2, 1));
    let samples = sample(&stub, "t", 2, Some(1000)).await.unwrap();
    let keys: Vec<u64> = samples.iter().map(Sample::key).collect();
    assert_eq!(keys, [2, 3]);
}

#[tokio::test]
async fn an_insert_waits_for_the_rate_limiter_and_is_confirmed_once_a_sample_makes_room() {
    let t = table("t", SelectorKind::Fifo, 10, 1, queue_limiter(1));
    let (stub, _) = serve(vec![t.clone()]).await;
    let mut stream = InsertStream::open(&stub).await;
    let one = |key| {
        request(
            vec![chunk(key, key, 1)],
            &[item(key, "t", 1.0, key, 0, 1)],
            vec![],
        )
    };
    assert_eq!(stream.insert(one(1)).await, [1]);
    stream.send(one(2)).await;
    wait_for("the second insert waits", || t.waits(Waiter::Insert).0 == 1).await;
    assert_eq!(size(&stub, "t").await, 1, "a blocked item is not stored");

    let samples = sample(&stub, "t", 1, Some(1000)).await.unwrap();
    assert_eq!(samples[0].key(), 1);
    assert_eq!(stream.confirmed().await, [2]);
    assert_eq!(size(&stub, "t").await, 1);
}

#[tokio::test]
async fn a_blocked_insert_whose_client_goes_away_stores_nothing() {
    let t = table("t", SelectorKind::Fifo, 10, 1, queue_limiter(1));
    let (stub, _) = serve(vec![t.clone()]).await;
    let mut stream = InsertStream::open(&stub).await;
    let one = |key| {
        request(
            vec![chunk(key, key, 1)],
            &[item(key, "t", 1.0, key, 0, 1)],
            vec![],
        )
    };
    assert_eq!(stream.insert(one(1)).await, [1]);
    stream.send(one(2)).await;
    wait_for("the second insert waits", || t.waits(Waiter::Insert).0 == 1).await;
    drop(stream);
    wait_for("the server drops the waiting insert", || {
        t.waits(Waiter::Insert).0 == 0
    })
    .await;

    // Room is made, but nobody is left to take it.
    let samples = sample(&stub, "t", 1, Some(1000)).await.unwrap();
    assert_eq!(samples[0].key(), 1);
    assert_eq!(size(&stub, "t").await, 0);
    assert_eq!(completed(&stub, "t").await, (1, 1));
}

#[tokio::test]
async fn item_runs_store_one_item_per_row_sharing_the_chunks() {
    let t = table("t", SelectorKind::Fifo, 100, 1, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    assert_eq!(server_info_response(&stub).await.features, ["item_runs"]);
    let mut stream = InsertStream::open(&stub).await;
    // Two columns over two 4-row chunks; items 10..13 hold rows 1..4, after a plain item.
    let mut request = request(
        vec![chunk(1, 7, 4), chunk(2, 7, 4)],
        &[item(9, "t", 0.5, 1, 0, 1)],
        vec![],
    );
    request.item_runs = vec![run("t", &[10, 11, 12], &[1, 2], 1)];
    request.item_runs[0].priorities = vec![1.0, 2.0, 3.0];
    assert_eq!(stream.insert(request).await, [9, 10, 11, 12]);
    let info = table_info(&stub, "t").await;
    assert_eq!((info.current_size, info.num_episodes), (4, 1));
    let samples = sample(&stub, "t", 4, Some(1000)).await.unwrap();
    for (i, s) in samples[1..].iter().enumerate() {
        let got = s.item();
        assert_eq!((got.key, got.priority), (10 + i as u64, 1.0 + i as f64));
        let columns = &got.flat_trajectory.as_ref().unwrap().columns;
        let slices: Vec<(u64, i32, i32)> = columns
            .iter()
            .map(|c| {
                let s = &c.chunk_slices[0];
                (s.chunk_key, s.offset, s.length)
            })
            .collect();
        assert_eq!(slices, [(1, 1 + i as i32, 1), (2, 1 + i as i32, 1)]);
        assert_eq!(s.chunks, [chunk(1, 7, 4), chunk(2, 7, 4)]);
    }
}

#[tokio::test]
async fn item_runs_that_do_not_fit_their_chunks_are_refused_and_nothing_of_the_request_stored() {
    let t = table("t", SelectorKind::Fifo, 100, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let cases: Vec<(ItemRun, Code, &[&str])> = vec![
        (
            run("t", &[1, 2], &[5], 0),
            Code::InvalidArgument,
            &["sequence chunk 5"],
        ),
        (
            run("t", &[1, 2], &[1], 2),
            Code::InvalidArgument,
            &["rows 2..4", "3 rows"],
        ),
        (
            run("t", &[1], &[1], -1),
            Code::InvalidArgument,
            &["rows -1..0"],
        ),
        (run("t", &[], &[1], 0), Code::InvalidArgument, &["0 keys"]),
        (
            run("t", &[1], &[], 0),
            Code::InvalidArgument,
            &["no columns"],
        ),
        (run("nope", &[1], &[1], 0), Code::NotFound, &["nope"]),
        // The last item's row past i32 (a tensor without data may claim 2^40 rows).
        (
            run("t", &[1, 2], &[3], i32::MAX),
            Code::InvalidArgument,
            &["rows 2147483647..2147483649"],
        ),
        (
            ItemRun {
                priorities: vec![1.0, 2.0],
                ..run("t", &[1], &[1], 0)
            },
            Code::InvalidArgument,
            &["1 keys and 2 priorities"],
        ),
        (
            ItemRun {
                priorities: vec![f64::NAN],
                ..run("t", &[1], &[1], 0)
            },
            Code::InvalidArgument,
            &["NaN"],
        ),
    ];
    for (bad, code, words) in cases {
        let mut stream = InsertStream::open(&stub).await;
        let mut refused = request(
            vec![chunk(1, 7, 3), no_data_rows(3, 1 << 40)],
            &[item(9, "t", 1.0, 1, 0, 1)],
            vec![],
        );
        refused.item_runs = vec![run("t", &[20], &[1], 0), bad];
        assert_status(&stream.refused(refused).await, code, words);
        assert_eq!(size(&stub, "t").await, 0, "{words:?}");
    }
}

#[tokio::test]
async fn an_item_run_waits_for_the_rate_limiter_and_keeps_its_order() {
    let t = table("t", SelectorKind::Fifo, 10, 1, queue_limiter(2));
    let (stub, _) = serve(vec![t.clone()]).await;
    let mut stream = InsertStream::open(&stub).await;
    let mut request = request(vec![chunk(1, 7, 5)], &[], vec![]);
    request.item_runs = vec![run("t", &[1, 2, 3, 4, 5], &[1], 0)];
    stream.send(request).await;
    wait_for("the run waits", || t.waits(Waiter::Insert).0 == 1).await;
    assert_eq!(
        size(&stub, "t").await,
        2,
        "the items the limiter allowed are stored"
    );
    let mut sampled = Vec::new();
    for _ in 0..5 {
        sampled.push(sample(&stub, "t", 1, Some(5000)).await.unwrap()[0].key());
    }
    assert_eq!(sampled, [1, 2, 3, 4, 5]);
    assert_eq!(stream.confirmed().await, [1, 2, 3, 4, 5]);
}

/// A chunk of one int32 tensor of `rows` rows of no elements (shape `[rows, 0]`).
fn no_data_rows(key: u64, rows: i64) -> reverb_proto::ChunkData {
    let tensor = reverb_client::Tensor::new(3, vec![rows, 0], vec![]).expect("a valid tensor");
    let range = reverb_proto::SequenceRange {
        episode_id: 7,
        start: 0,
        end: 0,
        sparse: false,
    };
    reverb_client::tensor::encode_chunk(key, range, &[tensor])
}
