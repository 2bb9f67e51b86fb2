//! The `SampleStream` call made by hand on the channel instead of through tonic's streaming
//! decoder, which copies every received HTTP/2 frame into one buffer before decoding. Here
//! responses are decoded straight from the received frames (a rope of `Bytes`), so the chunk
//! bytes of a sample are slices of what the socket delivered: one copy less per byte.

use crate::transport::channel::AuthChannel;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prost::Message;
use reverb_proto::{SampleStreamRequest, SampleStreamResponse};
use std::collections::VecDeque;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tower_service::Service;

const PATH: &str = "/deepmind.reverb.ReverbService/SampleStream";
/// The gRPC message header: a compression flag and a big-endian length.
const HEADER: usize = 5;

/// The responses of one `SampleStream` call.
pub(crate) struct SampleResponses {
    body: Body,
    received: Rope,
    max_message_size: usize,
    ended: bool,
    /// The status the server ended with, when not OK.
    failure: Option<Status>,
    /// The headers carried an OK status ("trailers-only"): no trailers follow.
    ended_in_headers: bool,
}

/// Starts a `SampleStream` call sending `requests`, with `metadata` (e.g. a ring offer).
pub(crate) async fn sample_stream(
    mut channel: AuthChannel,
    requests: impl Stream<Item = SampleStreamRequest> + Send + 'static,
    metadata: MetadataMap,
    max_message_size: usize,
) -> Result<SampleResponses, Status> {
    let frames = requests.map(|r| Ok::<_, Status>(Frame::data(frame(&r))));
    let mut request = http::Request::post(PATH)
        .version(http::Version::HTTP_2)
        .body(Body::new(StreamBody::new(frames)))
        .map_err(|e| Status::internal(format!("building the request: {e}")))?;
    let headers = request.headers_mut();
    headers.extend(metadata.into_headers());
    headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/grpc"),
    );
    headers.insert("te", http::HeaderValue::from_static("trailers"));
    futures::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(transport)?;
    let response = channel.call(request).await.map_err(transport)?;
    let (mut head, body) = response.into_parts();
    // A call that fails at once answers with headers only ("trailers-only").
    let status = status_of(&mut head.headers);
    if let Some(status) = status.clone().filter(|s| s.code() != Code::Ok) {
        return Err(status);
    }
    if head.status != http::StatusCode::OK {
        return Err(from_http(head.status));
    }
    if let Some(encoding) = head.headers.get("grpc-encoding") {
        if encoding != "identity" {
            return Err(Status::unimplemented(format!(
                "the server compressed its responses ({encoding:?}), which was not asked for"
            )));
        }
    }
    Ok(SampleResponses {
        body,
        received: Rope::default(),
        max_message_size,
        ended: false,
        failure: None,
        ended_in_headers: status.is_some(),
    })
}

fn missing_status() -> Status {
    Status::unknown("the sample stream ended without a gRPC status")
}

fn transport(e: tonic::transport::Error) -> Status {
    Status::from_error(Box::new(e))
}

/// The gRPC status in `headers`, if any. (Status details are dropped first: tonic panics on
/// malformed ones, and nothing here reads them.)
fn status_of(headers: &mut http::HeaderMap) -> Option<Status> {
    headers.remove("grpc-status-details-bin");
    Status::from_header_map(headers)
}

/// A status for an HTTP answer other than 200, as gRPC maps them (so a proxy's 503 is
/// UNAVAILABLE, which samplers retry).
fn from_http(status: http::StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("the server answered HTTP {status}"))
}

/// A request as one gRPC message.
fn frame(request: &SampleStreamRequest) -> Bytes {
    let len = request.encoded_len();
    let mut buf = BytesMut::with_capacity(HEADER + len);
    buf.extend_from_slice(&[0]);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    request.encode(&mut buf).expect("the buffer has room");
    buf.freeze()
}

impl SampleResponses {
    /// The next response; `None` once the server ended the call with OK. Responses that
    /// arrived before an error come first; after an error, `None`.
    pub(crate) async fn message(&mut self) -> Result<Option<SampleStreamResponse>, Status> {
        loop {
            match self.decode() {
                Ok(Some(response)) => return Ok(Some(response)),
                Ok(None) => {}
                Err(status) => {
                    // What follows a bad message cannot be framed: stop here.
                    self.received = Rope::default();
                    self.ended = true;
                    self.failure = None;
                    return Err(status);
                }
            }
            if self.ended {
                if let Some(status) = self.failure.take() {
                    return Err(status);
                }
                if self.received.remaining() > 0 {
                    self.received = Rope::default();
                    return Err(Status::internal("the sample stream ended inside a message"));
                }
                return Ok(None);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.received.push(data),
                    Err(frame) => {
                        self.ended = true;
                        let mut trailers = frame.into_trailers().unwrap_or_default();
                        self.failure = match status_of(&mut trailers) {
                            Some(status) => (status.code() != Code::Ok).then_some(status),
                            None => Some(missing_status()),
                        };
                    }
                },
                Some(Err(status)) => {
                    self.ended = true;
                    return Err(status);
                }
                // The body ended without trailers, so without a status: not a clean end.
                None if !self.ended => {
                    self.ended = true;
                    self.failure = (!self.ended_in_headers).then(missing_status);
                }
                None => {}
            }
        }
    }

    /// Whether the call is open with no received bytes waiting to be read.
    fn idle(&self) -> bool {
        !self.ended && self.received.remaining() == 0
    }

    /// A whole message from what was received, if there is one.
    fn decode(&mut self) -> Result<Option<SampleStreamResponse>, Status> {
        let Some(header) = self.received.header() else {
            return Ok(None);
        };
        if header[0] != 0 {
            return Err(Status::internal(
                "the server compressed a response, which was not asked for",
            ));
        }
        let len = u32::from_be_bytes(header[1..].try_into().expect("4 bytes")) as usize;
        if len > self.max_message_size {
            return Err(Status::out_of_range(format!(
                "a response of {len} bytes is larger than the limit of {}",
                self.max_message_size
            )));
        }
        if self.received.remaining() < HEADER + len {
            return Ok(None);
        }
        self.received.advance(HEADER);
        SampleStreamResponse::decode((&mut self.received).take(len))
            .map(Some)
            .map_err(|e| Status::internal(format!("a malformed sample response: {e}")))
    }
}

/// Received bytes as the frames that brought them: taking bytes that lie inside one frame
/// shares them instead of copying.
#[derive(Default)]
struct Rope {
    frames: VecDeque<Bytes>,
    remaining: usize,
}

impl Rope {
    fn push(&mut self, frame: Bytes) {
        if !frame.is_empty() {
            self.remaining += frame.len();
            self.frames.push_back(frame);
        }
    }

    /// The next message header, if all of it was received.
    fn header(&self) -> Option<[u8; HEADER]> {
        if self.remaining < HEADER {
            return None;
        }
        let mut out = [0u8; HEADER];
        let mut filled = 0;
        for frame in &self.frames {
            let take = (HEADER - filled).min(frame.len());
            out[filled..filled + take].copy_from_slice(&frame[..take]);
            filled += take;
            if filled == HEADER {
                break;
            }
        }
        Some(out)
    }
}

impl Buf for Rope {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.frames.front().map_or(&[], |f| &f[..])
    }

    fn advance(&mut self, mut n: usize) {
        assert!(n <= self.remaining, "advance past the end of the rope");
        self.remaining -= n;
        while n > 0 {
            let front = self
                .frames
                .front_mut()
                .expect("remaining bytes are in frames");
            if n < front.len() {
                front.advance(n);
                return;
            }
            n -= front.len();
            self.frames.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(
            len <= self.remaining,
            "copy_to_bytes past the end of the rope"
        );
        match self.frames.front_mut() {
            Some(front) if len <= front.len() => {
                self.remaining -= len;
                let out = front.split_to(len);
                if front.is_empty() {
                    self.frames.pop_front();
                }
                out
            }
            // Spans frames: join them (the only copy).
            _ => {
                let mut out = BytesMut::with_capacity(len);
                out.put((&mut *self).take(len));
                out.freeze()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reverb_proto::sample_stream_response::SampleEntry;
    use reverb_proto::ChunkData;

    #[test]
    fn bytes_inside_a_frame_are_shared_and_across_frames_joined() {
        let mut rope = Rope::default();
        let first = Bytes::from_static(b"hello ");
        rope.push(first.clone());
        rope.push(Bytes::new());
        rope.push(Bytes::from_static(b"world"));
        assert_eq!(&rope.header().unwrap(), b"hello");
        let hel = rope.copy_to_bytes(3);
        assert_eq!(hel.as_ptr(), first.as_ptr(), "shared, not copied");
        assert_eq!(&rope.copy_to_bytes(5)[..], b"lo wo");
        assert_eq!(rope.remaining(), 3);
        assert!(rope.header().is_none());
        rope.advance(1);
        assert_eq!(rope.chunk(), b"ld");
        assert_eq!(&rope.copy_to_bytes(2)[..], b"ld");
        assert_eq!((rope.remaining(), rope.chunk()), (0, &b""[..]));
    }

    fn responses() -> Vec<SampleStreamResponse> {
        let chunk = |key: u64, len: usize| ChunkData {
            chunk_key: key,
            data: (0..len)
                .map(|i| (i * 7 + key as usize) as u8)
                .collect::<Vec<_>>()
                .into(),
            ..Default::default()
        };
        (0..3)
            .map(|r| SampleStreamResponse {
                entries: (0..2)
                    .map(|e| SampleEntry {
                        data: vec![chunk(r * 10 + e, 50 + 20 * e as usize), chunk(99, 3)],
                        end_of_sequence: e == 1,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect()
    }

    fn wire(responses: &[SampleStreamResponse]) -> Bytes {
        let mut wire = BytesMut::new();
        for r in responses {
            wire.put_u8(0);
            wire.put_u32(r.encoded_len() as u32);
            r.encode(&mut wire).unwrap();
        }
        wire.freeze()
    }

    fn decode_all(rope: &mut Rope) -> Vec<SampleStreamResponse> {
        let mut out = Vec::new();
        while let Some(header) = rope.header() {
            let len = u32::from_be_bytes(header[1..].try_into().unwrap()) as usize;
            rope.advance(HEADER);
            out.push(SampleStreamResponse::decode(rope.take(len)).unwrap());
        }
        assert_eq!(rope.remaining(), 0);
        out
    }

    #[test]
    fn messages_split_anywhere_decode_the_same() {
        let expected = responses();
        let wire = wire(&expected);
        // Two frames cut at every byte, and one-byte frames.
        for cut in 0..=wire.len() {
            let mut rope = Rope::default();
            rope.push(wire.slice(..cut));
            rope.push(wire.slice(cut..));
            assert_eq!(decode_all(&mut rope), expected, "cut at {cut}");
        }
        let mut rope = Rope::default();
        for i in 0..wire.len() {
            rope.push(wire.slice(i..i + 1));
        }
        assert_eq!(decode_all(&mut rope), expected);
    }

    #[test]
    fn chunk_bytes_within_one_frame_are_slices_of_it() {
        let wire = wire(&responses());
        let mut rope = Rope::default();
        rope.push(wire.clone());
        let range = wire.as_ptr_range();
        for response in decode_all(&mut rope) {
            for chunk in response.entries.iter().flat_map(|e| &e.data) {
                assert!(
                    range.contains(&chunk.data.as_ptr()),
                    "chunk {} copied",
                    chunk.chunk_key
                );
            }
        }
    }
}

/// Most open `SampleStream` calls one connection keeps between one-shot calls.
const MAX_KEPT: usize = 4;

/// An open `SampleStream` call: its request side and its responses.
pub(crate) struct Call {
    pub(crate) requests: tokio::sync::mpsc::UnboundedSender<SampleStreamRequest>,
    pub(crate) responses: SampleResponses,
}

impl Call {
    /// Whether the call can serve another request: its request side is open and nothing
    /// arrived since its last request was served (a response, the end, or an error, e.g.
    /// the connection closing, all make it unusable).
    fn usable(&mut self) -> bool {
        use futures::FutureExt;
        !self.requests.is_closed()
            && self.responses.idle()
            && self.responses.message().now_or_never().is_none()
    }

    /// Half-closes the call and lets the server end it: a call dropped open is reset, and
    /// a server seeing many resets closes the connection ("rapid reset").
    fn close(self) {
        let Call {
            requests,
            mut responses,
        } = self;
        drop(requests);
        crate::runtime().spawn(async move {
            let end = async { while let Ok(Some(_)) = responses.message().await {} };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), end).await;
        });
    }
}

/// Open `SampleStream` calls of one connection, shared by a client's clones: a one-shot
/// sample call takes one, sends its request and gives it back once served, so it costs one
/// round trip instead of opening a call.
#[derive(Default)]
pub(crate) struct KeptStreams(parking_lot::Mutex<Vec<Call>>);

impl KeptStreams {
    /// A kept call that can serve another request, if there is one.
    pub(crate) fn take(&self) -> Option<Call> {
        loop {
            let mut stream = self.0.lock().pop()?;
            if stream.usable() {
                return Some(stream);
            }
        }
    }

    /// Keeps `stream` (served in full) for the next call, or closes it when enough are kept.
    pub(crate) fn give_back(&self, stream: Call) {
        let mut kept = self.0.lock();
        if kept.len() < MAX_KEPT {
            kept.push(stream);
        } else {
            drop(kept);
            stream.close();
        }
    }
}

impl Drop for KeptStreams {
    fn drop(&mut self) {
        for stream in self.0.get_mut().drain(..) {
            stream.close();
        }
    }
}
