//! The server under test and the wire-level helpers the tests share.
//!
//! [`serve`] runs the real gRPC service (`ReverbServiceImpl` behind the generated
//! `ReverbServiceServer`) on the test's runtime, over in-memory duplex streams as tonic's mock
//! example does: every connection a client makes is a fresh `tokio::io::duplex` pair whose
//! server half is handed to `serve_with_incoming`. Clients are the generated
//! `ReverbServiceClient` stub; no port is opened.
//!
//! Not covered here: the layers `Server::start` wraps around the service (the auth token
//! check and the per-connection message budget); those are tested with the server itself.
#![allow(dead_code)] // each test file uses a different subset

use hyper_util::rt::TokioIo;
use reverb_core::{RateLimiterConfig, SelectorKind, Table, TableConfig};
use reverb_proto::flat_trajectory::{ChunkSlice, Column};
use reverb_proto::reverb_service_client::ReverbServiceClient;
use reverb_proto::reverb_service_server::ReverbServiceServer;
use reverb_proto::sample_stream_response::SampleEntry;
use reverb_proto::tensorflow::DataType;
use reverb_proto::{
    encode_item, ChunkData, FlatTrajectory, InsertStreamRequest, InsertStreamResponse, ItemRun,
    PrioritizedItem, SampleBatch, SampleInfo, SampleStreamRequest, SampleStreamResponse,
    SequenceRange, ServerInfoRequest, ServerInfoResponse, TableInfo, Timeout,
};
use reverb_server::ReverbServiceImpl;
use std::collections::{BTreeMap, VecDeque};
use std::future::Ready;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::DuplexStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

/// The generated client stub over an in-memory connection.
pub type Stub = ReverbServiceClient<Channel>;

/// Bytes a duplex pipe buffers each way.
const PIPE_BYTES: usize = 1 << 20;

/// How long a test waits for a fact before failing.
const PATIENCE: Duration = Duration::from_secs(5);

/// Opens in-memory connections to the server [`serve`] started: each call makes a duplex
/// pair and hands the server its half.
#[derive(Clone)]
pub struct Connector(mpsc::UnboundedSender<DuplexStream>);

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<DuplexStream>;
    type Error = std::io::Error;
    type Future = Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let (client, server) = tokio::io::duplex(PIPE_BYTES);
        let connected = self
            .0
            .send(server)
            .map(|()| TokioIo::new(client))
            .map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the in-memory server has stopped",
                )
            });
        std::future::ready(connected)
    }
}

impl Connector {
    /// A new connection (its own HTTP/2 connection).
    pub async fn channel(&self) -> Channel {
        Endpoint::from_static("http://in-memory.invalid")
            .connect_with_connector(self.clone())
            .await
            .expect("the in-memory server accepts connections")
    }

    /// A new connection with the stub on it.
    pub async fn connect(&self) -> Stub {
        ReverbServiceClient::new(self.channel().await)
            .max_decoding_message_size(reverb_proto::max_message_size())
            .max_encoding_message_size(reverb_proto::max_message_size())
    }
}

/// Serves `tables` on the current runtime (until it shuts down); returns a stub on one
/// connection and the connector that opens more.
pub async fn serve(tables: Vec<Arc<Table>>) -> (Stub, Connector) {
    let service = ReverbServiceImpl::new(tables).expect("valid tables");
    // As `Server::start` builds it, without the auth and budget layers.
    let service = ReverbServiceServer::new(service)
        .max_decoding_message_size(reverb_proto::max_message_size())
        .max_encoding_message_size(reverb_proto::max_message_size());
    let (connections, incoming) = mpsc::unbounded_channel::<DuplexStream>();
    let incoming = UnboundedReceiverStream::new(incoming).map(Ok::<_, std::io::Error>);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    let connector = Connector(connections);
    (connector.connect().await, connector)
}

/// A rate limiter that lets samples go ahead once the table holds `min_size` items and never
/// blocks inserts (the reference's `MinSize`).
pub fn min_size(min_size: i64) -> RateLimiterConfig {
    RateLimiterConfig::min_size(min_size)
}

/// The reference's `Queue(size)` rate limiter: samples wait for an insert, inserts wait
/// while `size` items are unsampled.
pub fn queue_limiter(size: i64) -> RateLimiterConfig {
    RateLimiterConfig {
        samples_per_insert: 1.0,
        min_size_to_sample: 1,
        min_diff: 0.0,
        max_diff: size as f64,
    }
}

/// A table with a FIFO remover (its random choices seeded, so runs repeat).
pub fn table(
    name: &str,
    sampler: SelectorKind,
    max_size: i64,
    max_times_sampled: i32,
    rate_limiter: RateLimiterConfig,
) -> Arc<Table> {
    Arc::new(
        Table::with_seed(
            TableConfig {
                name: name.into(),
                sampler,
                remover: SelectorKind::Fifo,
                max_size,
                max_times_sampled,
                rate_limiter,
                signature: None,
            },
            7,
        )
        .expect("valid table"),
    )
}

/// A chunk of episode `episode` holding one int32 tensor of `rows` rows `[key, row]`.
pub fn chunk(key: u64, episode: u64, rows: i64) -> ChunkData {
    let data: Vec<u8> = (0..rows)
        .flat_map(|row| [key as i32, row as i32])
        .flat_map(i32::to_le_bytes)
        .collect();
    let tensor = reverb_client::Tensor::new(DataType::DtInt32 as i32, vec![rows, 2], data)
        .expect("a valid tensor");
    let range = SequenceRange {
        episode_id: episode,
        start: 0,
        end: rows as i32 - 1,
        sparse: false,
    };
    reverb_client::tensor::encode_chunk(key, range, &[tensor])
}

/// An item of `table` with one column: rows `offset..offset + length` of tensor 0 of chunk
/// `chunk_key`.
pub fn item(
    key: u64,
    table: &str,
    priority: f64,
    chunk_key: u64,
    offset: i32,
    length: i32,
) -> PrioritizedItem {
    PrioritizedItem {
        key,
        table: table.into(),
        priority,
        flat_trajectory: Some(FlatTrajectory {
            columns: vec![Column {
                chunk_slices: vec![ChunkSlice {
                    chunk_key,
                    offset,
                    length,
                    index: 0,
                }],
                squeeze: false,
            }],
        }),
        ..Default::default()
    }
}

/// An `InsertStreamRequest` of `chunks`, then `items` (encoded), keeping `keep`.
pub fn request(
    chunks: Vec<ChunkData>,
    items: &[PrioritizedItem],
    keep: Vec<u64>,
) -> InsertStreamRequest {
    InsertStreamRequest {
        chunks,
        items: items.iter().map(encode_item).collect(),
        keep_chunk_keys: keep,
        item_runs: Vec::new(),
    }
}

/// An item run of `table`: `keys` (priority 1.0 each), item `i` holding row `offset + i` of
/// tensor 0 of each of `chunk_keys` (one column each).
pub fn run(table: &str, keys: &[u64], chunk_keys: &[u64], offset: i32) -> ItemRun {
    ItemRun {
        table: table.into(),
        keys: keys.to_vec(),
        priorities: vec![1.0; keys.len()],
        columns: chunk_keys
            .iter()
            .map(|&chunk_key| reverb_proto::item_run::Column {
                chunk_key,
                index: 0,
                offset,
                squeeze: false,
            })
            .collect(),
    }
}

/// One open `InsertStream` call.
pub struct InsertStream {
    requests: mpsc::Sender<InsertStreamRequest>,
    responses: Streaming<InsertStreamResponse>,
}

impl InsertStream {
    /// Opens a stream on `stub`'s connection.
    pub async fn open(stub: &Stub) -> Self {
        let (requests, outbound) = mpsc::channel(16);
        let responses = stub
            .clone()
            .insert_stream(ReceiverStream::new(outbound))
            .await
            .expect("InsertStream opens")
            .into_inner();
        Self {
            requests,
            responses,
        }
    }

    /// Sends a request (without waiting for an answer).
    pub async fn send(&self, request: InsertStreamRequest) {
        self.requests
            .send(request)
            .await
            .expect("the request stream is open");
    }

    /// The next message the server sends: a confirmation, the end of the stream, or the
    /// status that ended it.
    pub async fn next(&mut self) -> Result<Option<InsertStreamResponse>, Status> {
        self.responses.message().await
    }

    /// The keys of the next confirmation (failing the test on anything else).
    pub async fn confirmed(&mut self) -> Vec<u64> {
        match self.next().await {
            Ok(Some(response)) => response.keys,
            other => panic!("expected a confirmation, got {other:?}"),
        }
    }

    /// Sends `request` and returns the keys the server confirms for it.
    pub async fn insert(&mut self, request: InsertStreamRequest) -> Vec<u64> {
        self.send(request).await;
        self.confirmed().await
    }

    /// Sends `request` and returns the status that ends the stream (failing the test if the
    /// server confirms anything or ends it cleanly).
    pub async fn refused(&mut self, request: InsertStreamRequest) -> Status {
        self.send(request).await;
        match self.next().await {
            Err(status) => status,
            other => panic!("expected the request to be refused, got {other:?}"),
        }
    }
}

/// Inserts `(key, priority)` items into `table` on a stream of their own, each item with a
/// one-row chunk of its own (chunk key and episode = item key); returns the confirmed keys.
pub async fn insert(stub: &Stub, table: &str, items: &[(u64, f64)]) -> Vec<u64> {
    let mut stream = InsertStream::open(stub).await;
    let mut confirmed = Vec::new();
    for &(key, priority) in items {
        let request = request(
            vec![chunk(key, key, 1)],
            &[item(key, table, priority, key, 0, 1)],
            vec![],
        );
        confirmed.extend(stream.insert(request).await);
    }
    confirmed
}

/// One sample as it arrives: its info (from its first entry) and its chunks (from all of its
/// entries).
#[derive(Debug, Clone)]
pub struct Sample {
    pub info: SampleInfo,
    pub chunks: Vec<ChunkData>,
    /// The entries it arrived in.
    pub entries: usize,
}

impl Sample {
    /// The sampled item's key.
    pub fn key(&self) -> u64 {
        self.item().key
    }

    /// The sampled item.
    pub fn item(&self) -> &PrioritizedItem {
        self.info.item.as_ref().expect("a sample names its item")
    }
}

/// One open `SampleStream` call.
pub struct SampleStream {
    requests: mpsc::Sender<SampleStreamRequest>,
    responses: Streaming<SampleStreamResponse>,
    /// Entries received but not yet returned.
    entries: VecDeque<SampleEntry>,
    /// Responses received so far.
    pub responses_received: usize,
}

impl SampleStream {
    /// Opens a stream on `stub`'s connection.
    pub async fn open(stub: &Stub) -> Self {
        let (requests, outbound) = mpsc::channel(16);
        let responses = stub
            .clone()
            .sample_stream(ReceiverStream::new(outbound))
            .await
            .expect("SampleStream opens")
            .into_inner();
        Self {
            requests,
            responses,
            entries: VecDeque::new(),
            responses_received: 0,
        }
    }

    /// Asks for `num_samples` samples of `table`, waiting at most `timeout_ms` for the rate
    /// limiter (`None`: no timeout field).
    pub async fn request(&self, table: &str, num_samples: i64, timeout_ms: Option<i64>) {
        let request = SampleStreamRequest {
            table: table.into(),
            num_samples,
            rate_limiter_timeout: timeout_ms.map(|milliseconds| Timeout { milliseconds }),
            ..Default::default()
        };
        self.requests
            .send(request)
            .await
            .expect("the request stream is open");
    }

    /// Asks for `num_samples` samples of `table` as columns.
    pub async fn request_columns(&self, table: &str, num_samples: i64, timeout_ms: i64) {
        let request = SampleStreamRequest {
            table: table.into(),
            num_samples,
            rate_limiter_timeout: Some(Timeout {
                milliseconds: timeout_ms,
            }),
            columnar: true,
            ..Default::default()
        };
        self.requests
            .send(request)
            .await
            .expect("the request stream is open");
    }

    /// The batches of the next `n` samples, which must come as columns.
    pub async fn batches(&mut self, n: usize) -> Vec<SampleBatch> {
        assert!(self.entries.is_empty(), "entries are waiting");
        let mut batches = Vec::new();
        let mut rows = 0;
        while rows < n {
            let response = self
                .responses
                .message()
                .await
                .expect("the stream goes on")
                .expect("the stream is open");
            self.responses_received += 1;
            assert!(response.entries.is_empty(), "entries instead of columns");
            let batch = response.batch.expect("a response with a batch");
            rows += batch.keys.len();
            batches.push(batch);
        }
        assert_eq!(rows, n, "more rows than asked for");
        batches
    }

    /// The next `n` whole samples (reassembled from their entries), or the status that ended
    /// the stream first. Fails the test if the server breaks the entry protocol.
    pub async fn samples(&mut self, n: usize) -> Result<Vec<Sample>, Status> {
        let mut samples = Vec::with_capacity(n);
        let mut open: Option<Sample> = None;
        while samples.len() < n {
            let entry = match self.entries.pop_front() {
                Some(entry) => entry,
                None => match self.responses.message().await? {
                    Some(response) => {
                        self.responses_received += 1;
                        assert!(!response.entries.is_empty(), "a response without entries");
                        self.entries.extend(response.entries);
                        continue;
                    }
                    None => panic!("the stream ended after {} samples", samples.len()),
                },
            };
            let sample = match (open.take(), entry.info) {
                (None, Some(info)) => Sample {
                    info,
                    chunks: Vec::new(),
                    entries: 0,
                },
                (Some(sample), None) => sample,
                (None, None) => panic!("a sample's first entry carries no info"),
                (Some(_), Some(_)) => panic!("a new sample began before end_of_sequence"),
            };
            let mut sample = sample;
            sample.chunks.extend(entry.data);
            sample.entries += 1;
            if entry.end_of_sequence {
                samples.push(sample);
            } else {
                open = Some(sample);
            }
        }
        assert!(open.is_none(), "a sample was cut short");
        Ok(samples)
    }

    /// The status that ends the stream (failing the test if samples come instead).
    pub async fn status(&mut self) -> Status {
        match self.responses.message().await {
            Err(status) => status,
            other => panic!("expected the stream to fail, got {other:?}"),
        }
    }
}

/// `n` samples of `table` on a stream of their own, waiting at most `timeout_ms`.
pub async fn sample(
    stub: &Stub,
    table: &str,
    n: i64,
    timeout_ms: Option<i64>,
) -> Result<Vec<Sample>, Status> {
    let mut stream = SampleStream::open(stub).await;
    stream.request(table, n, timeout_ms).await;
    stream.samples(n as usize).await
}

/// The `ServerInfo` answer.
pub async fn server_info_response(stub: &Stub) -> ServerInfoResponse {
    stub.clone()
        .server_info(ServerInfoRequest {})
        .await
        .expect("ServerInfo succeeds")
        .into_inner()
}

/// `ServerInfo`'s tables, by name.
pub async fn server_info(stub: &Stub) -> BTreeMap<String, TableInfo> {
    server_info_response(stub)
        .await
        .table_info
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect()
}

/// `ServerInfo` of one table.
pub async fn table_info(stub: &Stub, table: &str) -> TableInfo {
    server_info(stub)
        .await
        .remove(table)
        .unwrap_or_else(|| panic!("ServerInfo lists table {table}"))
}

/// Items `ServerInfo` says `table` holds.
pub async fn size(stub: &Stub, table: &str) -> i64 {
    table_info(stub, table).await.current_size
}

/// Inserts and samples the rate limiter of `table` counted, from `ServerInfo`.
pub async fn completed(stub: &Stub, table: &str) -> (i64, i64) {
    let limiter = table_info(stub, table)
        .await
        .rate_limiter_info
        .expect("a table reports its rate limiter");
    let done = |stats: Option<reverb_proto::RateLimiterCallStats>| stats.unwrap().completed;
    (done(limiter.insert_stats), done(limiter.sample_stats))
}

/// Asserts `status` has `code` and a message containing each of `words`.
pub fn assert_status(status: &Status, code: Code, words: &[&str]) {
    assert_eq!(status.code(), code, "{status:?}");
    for word in words {
        assert!(
            status.message().contains(word),
            "{:?} does not mention {word:?}",
            status.message()
        );
    }
}

/// Waits until `fact` holds (checking every millisecond, at most a few seconds); for
/// synchronising with the server on facts rather than on time.
pub async fn wait_for(what: &str, mut fact: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !fact() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
