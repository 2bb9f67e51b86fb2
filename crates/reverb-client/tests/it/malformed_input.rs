//! Malformed, truncated and hostile input gets a clear status and never disturbs the server.

use bytes::{Buf, BufMut};
use prost::Message;
use reverb_client::{Client, Tensor};

use crate::common::{block, grpc_client, insert_step, table, T};
use reverb_core::SelectorKind;
use reverb_proto::flat_trajectory::{ChunkSlice, Column};
use reverb_proto::tensorflow::DataType;
use reverb_proto::*;
use reverb_server::{Server, ServerOptions};
use std::io::Write;
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Code;

/// A codec that sends and receives raw bytes, to put arbitrary payloads on the wire.
#[derive(Clone, Default)]
struct RawCodec;
struct Raw;
impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}
impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let out = src.chunk().to_vec();
        src.advance(out.len());
        Ok(Some(out))
    }
}
impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

/// Sends raw messages on a streaming RPC (unary ones take the first) and returns the final
/// status code.
async fn raw_rpc(port: u16, method: &'static str, messages: Vec<Vec<u8>>) -> Code {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://localhost:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(method);
    let request = tonic::Request::new(tokio_stream::iter(messages));
    match grpc.streaming(request, path, RawCodec).await {
        Err(status) => status.code(),
        Ok(response) => {
            let mut stream = response.into_inner();
            loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => return Code::Ok,
                    Err(status) => return status.code(),
                }
            }
        }
    }
}

/// [`raw_rpc`], waited for.
fn raw_stream(port: u16, method: &'static str, messages: Vec<Vec<u8>>) -> Code {
    block(raw_rpc(port, method, messages))
}

fn item(key: u64, chunk_key: u64, table: &str) -> PrioritizedItem {
    PrioritizedItem {
        key,
        table: table.into(),
        priority: 1.0,
        flat_trajectory: Some(FlatTrajectory {
            columns: vec![Column {
                chunk_slices: vec![ChunkSlice {
                    chunk_key,
                    offset: 0,
                    length: 1,
                    index: 0,
                }],
                squeeze: false,
            }],
        }),
        ..Default::default()
    }
}

#[test]
fn bad_requests_get_clear_errors_and_lose_nothing() {
    let t = table("t", SelectorKind::Fifo, 100);
    let server = Server::start(vec![t.clone()], ServerOptions::default()).unwrap();
    let port = server.port();
    let client = Client::new(&format!("localhost:{port}"))
        .unwrap()
        .with_inproc(false);
    let one = Tensor::new(
        DataType::DtInt32 as i32,
        vec![],
        5i32.to_le_bytes().to_vec(),
    )
    .unwrap();
    insert_step(&client, vec![one.clone()], vec![("t".into(), 1.0)], T).unwrap();

    let insert = "/deepmind.reverb.ReverbService/InsertStream";
    let sample = "/deepmind.reverb.ReverbService/SampleStream";
    // Bytes that are not a protobuf message.
    assert_eq!(
        raw_stream(port, insert, vec![vec![0xff; 16]]),
        Code::Internal
    );
    assert_eq!(
        raw_stream(port, sample, vec![vec![0x0a, 0xff, 0xff]]),
        Code::Internal
    );
    let initialize = "/deepmind.reverb.ReverbService/InitializeConnection";
    assert_eq!(
        raw_stream(port, initialize, vec![vec![0xff; 16]]),
        Code::Internal
    );
    let hello = InitializeConnectionRequest {
        pid: 1,
        ..Default::default()
    };
    assert_eq!(
        raw_stream(port, initialize, vec![hello.encode_to_vec()]),
        Code::Ok
    );
    // A request with neither chunks nor items.
    let empty = InsertStreamRequest::default().encode_to_vec();
    assert_eq!(raw_stream(port, insert, vec![empty]), Code::InvalidArgument);
    // An item that is not a PrioritizedItem message (a table name longer than the item): the
    // server refuses it, and a client does not send it.
    let garbled = InsertStreamRequest {
        items: vec![bytes::Bytes::from_static(b"\x12\xff")],
        ..Default::default()
    };
    assert_eq!(
        raw_stream(port, insert, vec![garbled.encode_to_vec()]),
        Code::InvalidArgument
    );
    let err = block(client.insert_requests(vec![garbled], T)).unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(
        err.message.contains("not a PrioritizedItem"),
        "{}",
        err.message
    );
    // An item referencing a chunk that was never sent.
    let orphan = InsertStreamRequest {
        items: vec![encode_item(&item(9, 12345, "t"))],
        ..Default::default()
    };
    let err = block(client.insert_requests(vec![orphan], T)).unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("12345"), "{}", err.message);
    // A slice outside its chunk's declared bounds and a bad squeeze.
    let chunk = reverb_client::tensor::encode_chunk(77, SequenceRange::default(), &[]);
    let mut bad = item(10, 77, "t");
    bad.flat_trajectory.as_mut().unwrap().columns[0].chunk_slices[0].length = 0;
    let request = InsertStreamRequest {
        chunks: vec![chunk.clone()],
        items: vec![encode_item(&bad)],
        keep_chunk_keys: vec![],
        item_runs: Vec::new(),
    };
    assert_eq!(
        block(client.insert_requests(vec![request], T))
            .unwrap_err()
            .code,
        Code::InvalidArgument
    );
    let mut squeezed = item(11, 77, "t");
    squeezed.flat_trajectory.as_mut().unwrap().columns[0].chunk_slices[0].length = 2;
    squeezed.flat_trajectory.as_mut().unwrap().columns[0].squeeze = true;
    let request = InsertStreamRequest {
        chunks: vec![chunk],
        items: vec![encode_item(&squeezed)],
        keep_chunk_keys: vec![],
        item_runs: Vec::new(),
    };
    assert_eq!(
        block(client.insert_requests(vec![request], T))
            .unwrap_err()
            .code,
        Code::InvalidArgument
    );
    // Unknown tables, zero samples.
    assert_eq!(
        block(client.sample("nope", 1, None, T)).unwrap_err().code,
        Code::NotFound
    );
    assert_eq!(
        block(client.mutate_priorities("nope", vec![], vec![], T))
            .unwrap_err()
            .code,
        Code::NotFound
    );
    assert_eq!(
        block(client.reset("nope", T)).unwrap_err().code,
        Code::NotFound
    );
    let zero = SampleStreamRequest {
        table: "t".into(),
        num_samples: 0,
        rate_limiter_timeout: None,
        ..Default::default()
    };
    assert_eq!(
        raw_stream(port, sample, vec![zero.encode_to_vec()]),
        Code::InvalidArgument
    );
    // A negative priority for a prioritized selector is rejected by mutate without changes.
    // (Fifo accepts any non-NaN priority.)
    assert_eq!(
        block(client.mutate_priorities("t", vec![(1, f64::NAN)], vec![], T))
            .unwrap_err()
            .code,
        Code::InvalidArgument
    );

    // Garbage on a raw TCP connection (not even HTTP/2).
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n\x00\x01\x02garbage")
        .unwrap();
    drop(raw);
    // A half-sent gRPC frame: an HTTP/2 preface then a truncated stream.
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04")
        .unwrap();
    drop(raw);

    // Everything stored before is intact and the server still serves.
    assert_eq!(t.size(), 1);
    let samples = block(client.sample("t", 2, None, T)).unwrap();
    assert_eq!(samples[0].columns[0].data, 5i32.to_le_bytes().to_vec());
    insert_step(&client, vec![one], vec![("t".into(), 1.0)], T).unwrap();
    assert_eq!(t.size(), 2);
}

#[test]
fn client_disconnect_while_blocked_frees_the_stream() {
    // A sample blocked on an empty table, abandoned by its caller, must not wedge the table.
    let t = table("t", SelectorKind::Fifo, 100);
    let server = Server::start(vec![t.clone()], ServerOptions::default()).unwrap();
    let client = grpc_client(&server);
    let err = block(client.sample("t", 1, None, Some(Duration::from_millis(100)))).unwrap_err();
    assert_eq!(err.code, Code::DeadlineExceeded);
    // (The cancellation travels to the server asynchronously: give it a moment, as an item
    // inserted at the very instant a caller gives up can still go to that caller.)
    std::thread::sleep(Duration::from_millis(100));
    let one = Tensor::new(DataType::DtInt8 as i32, vec![], vec![1]).unwrap();
    insert_step(&client, vec![one], vec![("t".into(), 1.0)], T).unwrap();
    // The abandoned request took nothing: the one item is sampled exactly once here.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        t.info()
            .rate_limiter_info
            .unwrap()
            .sample_stats
            .unwrap()
            .completed,
        0
    );
    assert_eq!(block(client.sample("t", 1, None, T)).unwrap().len(), 1);
}

/// A chunk of one tensor of `rows` int32 rows (or, with `float`, float32 rows), each `[width]`.
fn rows_chunk(key: u64, rows: i64, width: i64, float: bool) -> ChunkData {
    let dtype = if float {
        DataType::DtFloat
    } else {
        DataType::DtInt32
    };
    let data = vec![0u8; (rows * width * 4) as usize];
    let tensor = Tensor::new(dtype as i32, vec![rows, width], data).unwrap();
    reverb_client::tensor::encode_chunk(key, SequenceRange::default(), &[tensor])
}

/// An item whose one column is made of `slices` (chunk key, offset, length, index).
fn sliced(key: u64, slices: &[(u64, i32, i32, i32)]) -> PrioritizedItem {
    let mut item = item(key, 0, "t");
    item.flat_trajectory.as_mut().unwrap().columns[0].chunk_slices = slices
        .iter()
        .map(|&(chunk_key, offset, length, index)| ChunkSlice {
            chunk_key,
            offset,
            length,
            index,
        })
        .collect();
    item
}

#[test]
fn items_no_sampler_could_decode_are_refused_and_the_table_keeps_serving() {
    let t = table("t", SelectorKind::Fifo, 100);
    let server = Server::start(vec![t.clone()], ServerOptions::default()).unwrap();
    let client = Client::new(&format!("localhost:{}", server.port()))
        .unwrap()
        .with_inproc(false);
    let refused = |chunks: Vec<ChunkData>, items: Vec<PrioritizedItem>| {
        let request = InsertStreamRequest {
            chunks,
            items: items.iter().map(encode_item).collect(),
            keep_chunk_keys: vec![],
            item_runs: Vec::new(),
        };
        let err = block(client.insert_requests(vec![request], T)).unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument, "{}", err.message);
        err.message
    };
    let good = || rows_chunk(1, 3, 2, false);

    // A slice beyond its tensor's rows, and a tensor index the chunk does not have.
    let message = refused(vec![good()], vec![sliced(10, &[(1, 2, 2, 0)])]);
    assert!(
        message.contains("rows 2..4") && message.contains("3 rows"),
        "{message}"
    );
    let message = refused(vec![good()], vec![sliced(11, &[(1, 0, 1, 1)])]);
    assert!(message.contains("tensor 1 of chunk 1"), "{message}");
    // One column joining rows of different dtypes, or of different shapes.
    let message = refused(
        vec![good(), rows_chunk(2, 3, 2, true)],
        vec![sliced(12, &[(1, 0, 3, 0), (2, 0, 3, 0)])],
    );
    assert!(
        message.contains("int32") && message.contains("float32"),
        "{message}"
    );
    let message = refused(
        vec![good(), rows_chunk(2, 3, 5, false)],
        vec![sliced(13, &[(1, 0, 3, 0), (2, 0, 3, 0)])],
    );
    assert!(
        message.contains("[2]") && message.contains("[5]"),
        "{message}"
    );
    // A dtype no client can decode.
    let mut resource = good();
    let mut tensors = ChunkTensors::decode(resource.data.clone()).unwrap();
    tensors.tensors[0].dtype = 20; // DT_RESOURCE
    resource.data = tensors.encode_to_vec().into();
    let message = refused(vec![resource], vec![sliced(14, &[(1, 0, 1, 0)])]);
    assert!(message.contains("dtype 20"), "{message}");
    // A payload whose size disagrees with its shape, and one that is not a payload at all.
    let mut short = good();
    let mut tensors = ChunkTensors::decode(short.data.clone()).unwrap();
    tensors.tensors[0].tensor_shape.as_mut().unwrap().dim[1].size = 3;
    short.data = tensors.encode_to_vec().into();
    let message = refused(vec![short], vec![sliced(15, &[(1, 0, 1, 0)])]);
    assert!(message.contains("needs 36 bytes"), "{message}");
    let mut garbage = good();
    garbage.data = bytes::Bytes::from_static(&[0xff, 0xff, 0xff]);
    let message = refused(vec![garbage], vec![sliced(19, &[(1, 0, 1, 0)])]);
    assert!(message.contains("malformed payload"), "{message}");
    // A request whose second item is bad stores neither.
    refused(
        vec![good()],
        vec![sliced(16, &[(1, 0, 1, 0)]), sliced(17, &[(1, 0, 9, 0)])],
    );
    // ... as does one whose second item has a priority the table refuses.
    let mut nan = sliced(21, &[(1, 0, 1, 0)]);
    nan.priority = f64::NAN;
    let message = refused(vec![good()], vec![sliced(20, &[(1, 0, 1, 0)]), nan]);
    assert!(message.contains("NaN"), "{message}");
    assert_eq!(t.size(), 0);

    // Good items of the same shapes are stored and sampled back.
    let request = InsertStreamRequest {
        chunks: vec![good(), rows_chunk(2, 1, 2, false)],
        items: vec![encode_item(&sliced(18, &[(1, 1, 2, 0), (2, 0, 1, 0)]))],
        keep_chunk_keys: vec![],
        item_runs: Vec::new(),
    };
    block(client.insert_requests(vec![request], T)).unwrap();
    assert_eq!(t.size(), 1);
    let samples = block(client.sample("t", 1, None, T)).unwrap();
    assert_eq!(samples[0].columns[0].shape, vec![3, 2]);
}

/// Starts an `InsertStream` whose body is `sent` and then never ends, on a connection of its
/// own; returns the stream's final status code (or `None` if it is still open after 5 s).
fn unfinished_insert(port: u16, sent: Vec<u8>) -> Option<Code> {
    use futures::StreamExt;
    use tower_service::Service;
    block(async move {
        let mut channel =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
                .unwrap()
                .connect()
                .await
                .unwrap();
        let frames = futures::stream::iter(vec![Ok::<_, tonic::Status>(http_body::Frame::data(
            bytes::Bytes::from(sent),
        ))])
        .chain(futures::stream::pending());
        let mut request = http::Request::post("/deepmind.reverb.ReverbService/InsertStream")
            .version(http::Version::HTTP_2)
            .body(tonic::body::Body::new(http_body_util::StreamBody::new(
                frames,
            )))
            .unwrap();
        let headers = request.headers_mut();
        headers.insert("content-type", "application/grpc".parse().unwrap());
        headers.insert("te", "trailers".parse().unwrap());
        let wait = async {
            futures::future::poll_fn(|cx| channel.poll_ready(cx))
                .await
                .unwrap();
            let response = channel.call(request).await.unwrap();
            let (head, mut body) = response.into_parts();
            if let Some(code) = head.headers.get("grpc-status") {
                return Code::from_bytes(code.as_bytes());
            }
            use http_body_util::BodyExt;
            while let Some(frame) = body.frame().await {
                if let Ok(trailers) = frame.unwrap().into_trailers() {
                    return Code::from_bytes(trailers["grpc-status"].as_bytes());
                }
            }
            Code::Unknown
        };
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .ok()
    })
}

/// A gRPC message header announcing `len` bytes.
fn announced(len: u32) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&len.to_be_bytes());
    out
}

#[test]
fn unfinished_messages_are_bounded_per_connection_and_per_server() {
    let t = table("t", SelectorKind::Fifo, 100);
    let options = ServerOptions {
        max_pending_bytes_per_connection: Some(256 << 10),
        max_pending_bytes: Some(400 << 10),
        ..ServerOptions::default()
    };
    let server = Server::start(vec![t.clone()], options).unwrap();
    let port = server.port();
    // A peer announcing 1 MiB and sending 300 KiB of it: over the connection's bound.
    let mut sent = announced(1 << 20);
    sent.extend(vec![0u8; 300 << 10]);
    assert_eq!(unfinished_insert(port, sent), Some(Code::ResourceExhausted));
    // Two peers each holding 200 KiB (under the connection bound): the first stays open,
    // the second passes the server's bound and fails.
    let holder = std::thread::spawn(move || {
        let mut sent = announced(1 << 20);
        sent.extend(vec![0u8; 200 << 10]);
        unfinished_insert(port, sent)
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut sent = announced(1 << 20);
    sent.extend(vec![0u8; 250 << 10]);
    assert_eq!(unfinished_insert(port, sent), Some(Code::ResourceExhausted));
    // Meanwhile, and after, well-behaved clients are served.
    let client = Client::new(&format!("localhost:{port}"))
        .unwrap()
        .with_inproc(false);
    let one = Tensor::new(
        DataType::DtInt32 as i32,
        vec![],
        5i32.to_le_bytes().to_vec(),
    )
    .unwrap();
    insert_step(&client, vec![one.clone()], vec![("t".into(), 1.0)], T).unwrap();
    assert_eq!(
        holder.join().unwrap(),
        None,
        "the holder's stream stays open"
    );
    insert_step(&client, vec![one], vec![("t".into(), 1.0)], T).unwrap();
    assert_eq!(t.size(), 2);
}

/// [`raw_rpc`], or `None` when the call had not ended after half a second.
fn raw_call(port: u16, method: &'static str, messages: Vec<Vec<u8>>) -> Option<Code> {
    block(async move {
        tokio::time::timeout(Duration::from_millis(500), raw_rpc(port, method, messages))
            .await
            .ok()
    })
}

#[test]
fn wire_fuzz_of_every_rpc_loses_nothing_of_a_well_behaved_client() {
    use rand::{Rng, SeedableRng};
    const GOOD: &str = "well_behaved_client_table_0123456789";
    let good_table = table(GOOD, SelectorKind::Uniform, 1_000_000);
    let scratch = table("t", SelectorKind::Fifo, 100);
    let server =
        Server::start(vec![good_table.clone(), scratch], ServerOptions::default()).unwrap();
    let port = server.port();
    // Valid messages of every RPC, to mutate.
    let chunk = rows_chunk(1, 3, 2, false);
    let valid: Vec<(&'static str, Vec<u8>)> = vec![
        (
            "/deepmind.reverb.ReverbService/InsertStream",
            InsertStreamRequest {
                chunks: vec![chunk],
                items: vec![encode_item(&sliced(5, &[(1, 0, 2, 0)]))],
                keep_chunk_keys: vec![1],
                item_runs: Vec::new(),
            }
            .encode_to_vec(),
        ),
        (
            "/deepmind.reverb.ReverbService/SampleStream",
            SampleStreamRequest {
                table: "t".into(),
                num_samples: 2,
                rate_limiter_timeout: Some(Timeout { milliseconds: 50 }),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "/deepmind.reverb.ReverbService/MutatePriorities",
            MutatePrioritiesRequest {
                table: "t".into(),
                updates: vec![KeyWithPriority {
                    key: 5,
                    priority: 2.0,
                }],
                delete_keys: vec![5],
            }
            .encode_to_vec(),
        ),
        (
            "/deepmind.reverb.ReverbService/Reset",
            ResetRequest { table: "t".into() }.encode_to_vec(),
        ),
        (
            "/deepmind.reverb.ReverbService/ServerInfo",
            ServerInfoRequest {}.encode_to_vec(),
        ),
        (
            "/deepmind.reverb.ReverbService/Checkpoint",
            CheckpointRequest {}.encode_to_vec(),
        ),
        (
            "/deepmind.reverb.ReverbService/InitializeConnection",
            InitializeConnectionRequest {
                pid: 1,
                table_name: "t".into(),
                ownership_transferred: false,
            }
            .encode_to_vec(),
        ),
    ];
    // The well-behaved client inserts (and samples) all along.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let client = Client::new(&format!("localhost:{port}"))
                .unwrap()
                .with_inproc(false);
            let (mut inserted, mut failed) = (0i32, 0i32);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let value = Tensor::new(
                    DataType::DtInt32 as i32,
                    vec![],
                    inserted.to_le_bytes().to_vec(),
                )
                .unwrap();
                // A call that fails (the transport may: the server is being hammered) is
                // retried as a client would; an insert that failed may or may not be stored.
                match insert_step(&client, vec![value], vec![(GOOD.into(), 1.0)], T) {
                    Ok(_) => inserted += 1,
                    Err(e) => {
                        eprintln!("well-behaved insert failed: {e:?}");
                        failed += 1;
                    }
                }
                if let Err(e) = block(client.sample(GOOD, 1, None, T)) {
                    eprintln!("well-behaved sample failed: {e:?}");
                }
            }
            (inserted, failed)
        })
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let started = std::time::Instant::now();
    let mut calls = 0;
    while started.elapsed() < Duration::from_secs(4) {
        let (method, message) = &valid[rng.random_range(0..valid.len())];
        let mut bytes = message.clone();
        match rng.random_range(0..4) {
            // Random bytes.
            0 => {
                bytes = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
            }
            // Flipped bits.
            1 => {
                for _ in 0..rng.random_range(1..4) {
                    if !bytes.is_empty() {
                        let i = rng.random_range(0..bytes.len());
                        bytes[i] ^= 1 << rng.random_range(0..8);
                    }
                }
            }
            // Truncated.
            2 => bytes.truncate(rng.random_range(0..=bytes.len())),
            // Random bytes spliced in.
            _ => {
                let at = rng.random_range(0..=bytes.len());
                let junk: Vec<u8> = (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
                bytes.splice(at..at, junk);
            }
        }
        let copies = rng.random_range(1..3);
        let _ = raw_call(port, method, vec![bytes; copies]);
        calls += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (inserted, failed) = writer.join().unwrap();
    assert!(calls > 50, "only {calls} fuzzed calls");
    assert!(
        inserted > 10 && failed < inserted,
        "{inserted} inserts, {failed} failed"
    );
    // Every confirmed item of the well-behaved client is there, with its data.
    let size = good_table.size() as i32;
    assert!(
        (inserted..=inserted + failed).contains(&size),
        "{size} items, {inserted} confirmed"
    );
    let client = Client::new(&format!("localhost:{port}"))
        .unwrap()
        .with_inproc(false);
    let samples = block(client.sample(GOOD, 20, None, T)).unwrap();
    assert_eq!(samples.len(), 20);
    for sample in samples {
        let v = i32::from_le_bytes(sample.columns[0].data[..4].try_into().unwrap());
        assert!((0..inserted + failed).contains(&v));
    }
}
