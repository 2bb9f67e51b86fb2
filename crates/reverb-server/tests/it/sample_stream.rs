//! `SampleStream` as a client sees it over the wire: samples with their chunks and info,
//! entries and responses, several requests on one stream, the legacy `flexible_batch_size`
//! field, rate-limiter timeouts, `max_times_sampled` and cancellation.

use crate::common::*;
use reverb_core::{SelectorKind, Waiter};
use reverb_proto::codec::ReverbCodec;
use reverb_proto::tensorflow::DataType;
use reverb_proto::{ChunkData, SampleStreamResponse, SequenceRange, Timeout};
use reverb_server::RATE_LIMITER_TIMEOUT;
use tonic::Code;

/// The reference's words for a sample the rate limiter never allowed in time.
const REFERENCE_TIMEOUT_MESSAGE: &str =
    "Rate Limiter: Timeout exceeded before the right to sample was acquired.";

#[tokio::test]
async fn samples_carry_their_item_chunks_and_info() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let sent_chunk = chunk(1, 7, 2);
    let sent_item = item(1, "t", 0.5, 1, 0, 2);
    let mut stream = InsertStream::open(&stub).await;
    stream
        .insert(request(
            vec![sent_chunk.clone()],
            std::slice::from_ref(&sent_item),
            vec![],
        ))
        .await;
    insert(&stub, "t", &[(2, 1.0)]).await;

    // FIFO samples the oldest item every time; it stays (no max_times_sampled).
    let samples = sample(&stub, "t", 3, Some(1000)).await.unwrap();
    for (n, sample) in samples.iter().enumerate() {
        let got = sample.item();
        assert_eq!(got.key, 1);
        assert_eq!(got.table, "t");
        assert_eq!(got.priority, 0.5);
        assert_eq!(got.times_sampled, n as i32 + 1);
        assert_eq!(got.flat_trajectory, sent_item.flat_trajectory);
        assert!(got.inserted_at.is_some());
        assert_eq!(sample.info.probability, 1.0);
        assert_eq!(sample.info.table_size, 2);
        assert!(!sample.info.rate_limited);
        assert_eq!(sample.chunks, std::slice::from_ref(&sent_chunk));
        assert_eq!(sample.entries, 1);
    }
    let info = table_info(&stub, "t").await;
    assert_eq!((info.current_size, info.num_unique_samples), (2, 1));
    assert_eq!(completed(&stub, "t").await, (2, 3));
}

#[tokio::test]
async fn probabilities_are_those_of_the_sampler() {
    let uniform = table("uniform", SelectorKind::Uniform, 10, 0, min_size(1));
    let prioritized = table(
        "prioritized",
        SelectorKind::Prioritized {
            priority_exponent: 2.0,
        },
        10,
        0,
        min_size(1),
    );
    let (stub, _) = serve(vec![uniform, prioritized]).await;
    insert(&stub, "uniform", &[(1, 1.0), (2, 5.0), (3, 1.0), (4, 1.0)]).await;
    for sample in sample(&stub, "uniform", 8, Some(1000)).await.unwrap() {
        assert_eq!(sample.info.probability, 0.25);
        assert_eq!(sample.info.table_size, 4);
    }
    // Weights 1^2 = 1 and 3^2 = 9.
    insert(&stub, "prioritized", &[(1, 1.0), (2, 3.0)]).await;
    for sample in sample(&stub, "prioritized", 8, Some(1000)).await.unwrap() {
        let expected = match sample.key() {
            1 => 0.1,
            2 => 0.9,
            other => panic!("unexpected key {other}"),
        };
        assert!(
            (sample.info.probability - expected).abs() < 1e-9,
            "key {}: {}",
            sample.key(),
            sample.info.probability
        );
    }
}

#[tokio::test]
async fn one_stream_serves_its_requests_in_order() {
    let t = table("t", SelectorKind::Fifo, 10, 1, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    insert(
        &stub,
        "t",
        &[(1, 1.0), (2, 1.0), (3, 1.0), (4, 1.0), (5, 1.0)],
    )
    .await;
    let mut stream = SampleStream::open(&stub).await;
    // Both requests are sent before anything is read.
    stream.request("t", 2, Some(1000)).await;
    stream.request("t", 3, Some(1000)).await;
    let keys: Vec<u64> = stream
        .samples(5)
        .await
        .unwrap()
        .iter()
        .map(Sample::key)
        .collect();
    assert_eq!(keys, [1, 2, 3, 4, 5]);
    // The stream is still open for more.
    insert(&stub, "t", &[(6, 1.0)]).await;
    stream.request("t", 1, Some(1000)).await;
    assert_eq!(stream.samples(1).await.unwrap()[0].key(), 6);
}

/// Not in the reference: a request with `columnar` gets its samples as columns (the rows
/// of each column stacked, info as arrays); one without, on the same stream, entries.
#[tokio::test]
async fn columnar_requests_get_columns_and_others_entries() {
    let t = table("t", SelectorKind::Fifo, 10, 1, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    insert(&stub, "t", &[(1, 0.5), (2, 1.5), (3, 2.5), (4, 1.0)]).await;
    let mut stream = SampleStream::open(&stub).await;
    stream.request_columns("t", 3, 1000).await;
    let batches = stream.batches(3).await;
    let (mut keys, mut priorities, mut sizes) =
        (Vec::<u64>::new(), Vec::<f64>::new(), Vec::<i64>::new());
    let mut data = Vec::<i32>::new();
    for b in &batches {
        let n = b.keys.len();
        assert_eq!(
            (b.probabilities.len(), b.times_sampled.len()),
            (n, n),
            "{b:?}"
        );
        assert_eq!(b.probabilities, vec![1.0; n]);
        assert_eq!(b.times_sampled, vec![1; n]);
        assert_eq!(b.columns.len(), 1);
        let column = &b.columns[0];
        assert_eq!(column.dtype, DataType::DtInt32 as i32);
        assert_eq!(column.shape, vec![n as i64, 1, 2]);
        keys.extend(&b.keys);
        priorities.extend(&b.priorities);
        sizes.extend(&b.table_sizes);
        data.extend(
            column
                .data
                .chunks(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap())),
        );
    }
    // FIFO order; each item's one row is `[key, 0]` (see `chunk`); sampling deletes them.
    assert_eq!(keys, [1, 2, 3]);
    assert_eq!(priorities, [0.5, 1.5, 2.5]);
    assert_eq!(sizes, [4, 3, 2]);
    assert_eq!(data, [1, 0, 2, 0, 3, 0]);
    stream.request("t", 1, Some(1000)).await;
    let sample = &stream.samples(1).await.unwrap()[0];
    assert_eq!(sample.key(), 4);
    assert_eq!(sample.chunks, [chunk(4, 4, 1)]);
}

/// A chunk of one row of 1.5 MiB that does not compress.
fn big_chunk(key: u64) -> ChunkData {
    let mut state = 0x9e37_79b9 + key;
    let data: Vec<u8> = (0..3 << 19)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let len = data.len() as i64;
    let tensor = reverb_client::Tensor::new(DataType::DtUint8 as i32, vec![1, len], data).unwrap();
    let range = SequenceRange {
        episode_id: 1,
        start: key as i32,
        end: key as i32,
        sparse: false,
    };
    let chunk = reverb_client::tensor::encode_chunk(key, range, &[tensor]);
    assert!(chunk.data.len() > 3 << 18);
    chunk
}

/// Inserts item 1 into table "t": one column through `n` chunks of 1.5 MiB (returned).
async fn insert_big_item(stub: &Stub, n: u64) -> Vec<ChunkData> {
    let chunks: Vec<ChunkData> = (0..n).map(big_chunk).collect();
    let mut item = item(1, "t", 1.0, 0, 0, 1);
    let column = &mut item.flat_trajectory.as_mut().unwrap().columns[0];
    for key in 1..n {
        let mut next = column.chunk_slices[0];
        next.chunk_key = key;
        column.chunk_slices.push(next);
    }
    let mut writer = InsertStream::open(stub).await;
    assert_eq!(
        writer
            .insert(request(chunks.clone(), &[item], vec![]))
            .await,
        [1]
    );
    chunks
}

/// A sample whose rows are too large for one batch of columns (over 16 MiB) comes as
/// entries, split over responses, even to a request for columns.
#[tokio::test]
async fn too_large_a_batch_of_columns_comes_as_entries() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let chunks = insert_big_item(&stub, 12).await;
    let mut stream = SampleStream::open(&stub).await;
    stream.request_columns("t", 2, 1000).await;
    let samples = stream.samples(2).await.unwrap();
    assert!(samples.iter().all(|s| s.chunks == chunks));
}

#[tokio::test]
async fn a_sample_larger_than_a_response_spans_entries() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    // Two chunks of 1.5 MiB that do not compress; one column through both.
    let chunks = insert_big_item(&stub, 2).await;

    let mut stream = SampleStream::open(&stub).await;
    stream.request("t", 1, Some(1000)).await;
    let samples = stream.samples(1).await.unwrap();
    // Info on the first entry, end_of_sequence on the last (checked by `samples`).
    assert_eq!(samples[0].entries, 2);
    assert_eq!(stream.responses_received, 2);
    assert_eq!(samples[0].chunks, chunks);
}

/// `SampleStreamRequest` as clients before Reverb 0.6 sent it, with `flexible_batch_size`
/// (field 4, reserved since).
#[derive(Clone, PartialEq, prost::Message)]
struct LegacySampleStreamRequest {
    #[prost(string, tag = "1")]
    table: String,
    #[prost(int64, tag = "2")]
    num_samples: i64,
    #[prost(message, optional, tag = "3")]
    rate_limiter_timeout: Option<Timeout>,
    #[prost(int64, tag = "4")]
    flexible_batch_size: i64,
}

#[tokio::test]
async fn a_legacy_flexible_batch_size_is_ignored() {
    let t = table("t", SelectorKind::Fifo, 10, 1, min_size(1));
    let (stub, connector) = serve(vec![t]).await;
    insert(&stub, "t", &[(1, 1.0), (2, 1.0), (3, 1.0)]).await;
    let mut grpc = tonic::client::Grpc::new(connector.channel().await);
    grpc.ready().await.unwrap();
    let request = LegacySampleStreamRequest {
        table: "t".into(),
        num_samples: 3,
        rate_limiter_timeout: Some(Timeout { milliseconds: 1000 }),
        flexible_batch_size: 1,
    };
    let mut responses = grpc
        .streaming(
            tonic::Request::new(tokio_stream::iter([request])),
            http::uri::PathAndQuery::from_static("/deepmind.reverb.ReverbService/SampleStream"),
            ReverbCodec::<LegacySampleStreamRequest, SampleStreamResponse>::default(),
        )
        .await
        .unwrap()
        .into_inner();
    let mut keys = Vec::new();
    while let Some(response) = responses.message().await.unwrap() {
        for entry in response.entries {
            assert!(entry.end_of_sequence, "one entry per small sample");
            keys.push(entry.info.unwrap().item.unwrap().key);
        }
    }
    // The server ended the stream once the client's side closed and the request was served.
    assert_eq!(keys, [1, 2, 3]);
}

#[tokio::test]
async fn items_are_deleted_when_sampled_max_times_sampled_times() {
    let once = table("once", SelectorKind::Fifo, 10, 1, min_size(1));
    let twice = table("twice", SelectorKind::Fifo, 10, 2, min_size(1));
    let (stub, _) = serve(vec![once, twice]).await;
    insert(&stub, "once", &[(1, 1.0), (2, 1.0), (3, 1.0)]).await;
    let samples = sample(&stub, "once", 2, Some(1000)).await.unwrap();
    let seen: Vec<(u64, i32, i64)> = samples
        .iter()
        .map(|s| (s.key(), s.item().times_sampled, s.info.table_size))
        .collect();
    // Each sample sees the table before its own deletion.
    assert_eq!(seen, [(1, 1, 3), (2, 1, 2)]);
    let info = table_info(&stub, "once").await;
    assert_eq!((info.current_size, info.num_deleted_episodes), (1, 2));

    insert(&stub, "twice", &[(1, 1.0), (2, 1.0)]).await;
    let samples = sample(&stub, "twice", 3, Some(1000)).await.unwrap();
    let seen: Vec<(u64, i32)> = samples
        .iter()
        .map(|s| (s.key(), s.item().times_sampled))
        .collect();
    assert_eq!(seen, [(1, 1), (1, 2), (2, 1)]);
    assert_eq!(size(&stub, "twice").await, 1);
}

#[tokio::test]
async fn a_sample_the_rate_limiter_does_not_allow_in_time_is_deadline_exceeded() {
    let t = table("t", SelectorKind::Fifo, 10, 1, min_size(2));
    let (stub, _) = serve(vec![t]).await;
    assert_eq!(RATE_LIMITER_TIMEOUT, REFERENCE_TIMEOUT_MESSAGE);
    // Empty, then below min_size_to_sample.
    for key in [1, 2] {
        let status = sample(&stub, "t", 1, Some(20)).await.unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(status.message(), REFERENCE_TIMEOUT_MESSAGE);
        insert(&stub, "t", &[(key, 1.0)]).await;
    }
    // Two items, min_size 2: a request for three gets the one sample the limiter allows (its
    // deletion takes the table below min_size), then the timeout.
    let mut stream = SampleStream::open(&stub).await;
    stream.request("t", 3, Some(20)).await;
    let keys: Vec<u64> = stream
        .samples(1)
        .await
        .unwrap()
        .iter()
        .map(Sample::key)
        .collect();
    assert_eq!(keys, [1]);
    assert_status(
        &stream.status().await,
        Code::DeadlineExceeded,
        &[REFERENCE_TIMEOUT_MESSAGE],
    );
    assert_eq!(size(&stub, "t").await, 1);
}

#[tokio::test]
async fn no_timeout_or_one_of_zero_or_less_waits_until_an_insert() {
    let t = table("t", SelectorKind::Fifo, 10, 1, min_size(1));
    let (stub, _) = serve(vec![t.clone()]).await;
    for (key, timeout_ms) in [(1, None), (2, Some(0)), (3, Some(-1))] {
        let mut stream = SampleStream::open(&stub).await;
        stream.request("t", 1, timeout_ms).await;
        wait_for("the sampler waits", || t.waits(Waiter::Sample).0 == 1).await;
        insert(&stub, "t", &[(key, 1.0)]).await;
        let samples = stream.samples(1).await.unwrap();
        assert_eq!(samples[0].key(), key, "timeout {timeout_ms:?}");
    }
}

#[tokio::test]
async fn a_sampler_that_goes_away_takes_nothing() {
    let t = table("t", SelectorKind::Fifo, 10, 1, min_size(1));
    let (stub, _) = serve(vec![t.clone()]).await;
    let stream = SampleStream::open(&stub).await;
    stream.request("t", 1, None).await;
    wait_for("the sampler waits", || t.waits(Waiter::Sample).0 == 1).await;
    drop(stream);
    wait_for("the server drops the waiting sampler", || {
        t.waits(Waiter::Sample).0 == 0
    })
    .await;
    insert(&stub, "t", &[(1, 1.0)]).await;
    assert_eq!(size(&stub, "t").await, 1);
    assert_eq!(completed(&stub, "t").await, (1, 0));
    let samples = sample(&stub, "t", 1, Some(1000)).await.unwrap();
    assert_eq!(samples[0].key(), 1);
}

#[tokio::test]
async fn bad_requests_end_the_stream_with_their_status() {
    let t = table("t", SelectorKind::Fifo, 10, 0, min_size(1));
    let (stub, _) = serve(vec![t]).await;
    let status = sample(&stub, "nope", 1, Some(1000)).await.unwrap_err();
    assert_status(
        &status,
        Code::NotFound,
        &["Priority table nope was not found", "[t]"],
    );
    for n in [0, -1] {
        let mut stream = SampleStream::open(&stub).await;
        stream.request("t", n, Some(1000)).await;
        assert_status(
            &stream.status().await,
            Code::InvalidArgument,
            &["num_samples"],
        );
    }
}
