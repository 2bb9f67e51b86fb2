//! Malformed, truncated and hostile input gets a clear status and never disturbs the server.

use bytes::{Buf, BufMut};
use prost::Message;
use reverb_client::{Client, Tensor};
mod common;

use common::{block, grpc_client, table, T};
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

/// Sends raw messages on a streaming RPC and returns the final status code.
fn raw_stream(port: u16, method: &'static str, messages: Vec<Vec<u8>>) -> Code {
    block(async move {
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
    })
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
    block(client.insert_step(vec![one.clone()], vec![("t".into(), 1.0)], T)).unwrap();

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
    // A request with neither chunks nor items.
    let empty = InsertStreamRequest::default().encode_to_vec();
    assert_eq!(raw_stream(port, insert, vec![empty]), Code::InvalidArgument);
    // An item referencing a chunk that was never sent.
    let orphan = InsertStreamRequest {
        items: vec![item(9, 12345, "t")],
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
        items: vec![bad],
        keep_chunk_keys: vec![],
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
        items: vec![squeezed],
        keep_chunk_keys: vec![],
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
        shm_released: 0,
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
    block(client.insert_step(vec![one], vec![("t".into(), 1.0)], T)).unwrap();
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
    block(client.insert_step(vec![one], vec![("t".into(), 1.0)], T)).unwrap();
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
