//! The `SampleStream` call made by hand on the channel instead of through tonic's streaming
//! decoder, which copies every received HTTP/2 frame into one buffer before decoding. Here
//! responses are decoded straight from the received frames (a rope of `Bytes`), so the chunk
//! bytes of a sample are slices of what the socket delivered: one copy less per byte.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use prost::Message;
use reverb_proto::{SampleStreamRequest, SampleStreamResponse};
use std::collections::VecDeque;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
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
}

/// Starts a `SampleStream` call sending `requests`, with `metadata` (e.g. a ring offer).
pub(crate) async fn sample_stream(
    mut channel: Channel,
    requests: impl Stream<Item = SampleStreamRequest> + Send + 'static,
    metadata: MetadataMap,
    max_message_size: usize,
) -> Result<SampleResponses, Status> {
    let frames = requests.map(|r| Ok::<_, Status>(Frame::data(frame(&r))));
    let mut request = http::Request::post(PATH)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Body::new(StreamBody::new(frames)))
        .map_err(|e| Status::internal(format!("building the request: {e}")))?;
    request.headers_mut().extend(metadata.into_headers());
    futures::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(transport)?;
    let response = channel.call(request).await.map_err(transport)?;
    let (head, body) = response.into_parts();
    // A call that fails at once answers with headers only ("trailers-only").
    if let Some(status) = Status::from_header_map(&head.headers) {
        if status.code() != Code::Ok {
            return Err(status);
        }
    }
    if head.status != http::StatusCode::OK {
        return Err(Status::unknown(format!(
            "the server answered HTTP {}",
            head.status
        )));
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
    })
}

fn transport(e: tonic::transport::Error) -> Status {
    Status::from_error(Box::new(e))
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
    /// arrived before an error come first.
    pub(crate) async fn message(&mut self) -> Result<Option<SampleStreamResponse>, Status> {
        loop {
            if let Some(response) = self.decode()? {
                return Ok(Some(response));
            }
            if self.ended {
                if let Some(status) = self.failure.take() {
                    return Err(status);
                }
                if self.received.remaining() > 0 {
                    return Err(Status::internal("the sample stream ended inside a message"));
                }
                return Ok(None);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.received.push(data),
                    Err(frame) => {
                        self.ended = true;
                        let trailers = frame.into_trailers().unwrap_or_default();
                        self.failure =
                            Status::from_header_map(&trailers).filter(|s| s.code() != Code::Ok);
                    }
                },
                Some(Err(status)) => return Err(status),
                None => self.ended = true,
            }
        }
    }

    /// A whole message from what was received, if there is one.
    fn decode(&mut self) -> Result<Option<SampleStreamResponse>, Status> {
        let Some(header) = self.received.peek(HEADER) else {
            return Ok(None);
        };
        if header[0] != 0 {
            return Err(Status::unimplemented(
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

    /// The first `n` bytes (copied: `n` is a header's size), if there are that many.
    fn peek(&self, n: usize) -> Option<Vec<u8>> {
        if self.remaining < n {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for frame in &self.frames {
            let take = (n - out.len()).min(frame.len());
            out.extend_from_slice(&frame[..take]);
            if out.len() == n {
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

    #[test]
    fn bytes_inside_a_frame_are_shared_and_across_frames_joined() {
        let mut rope = Rope::default();
        let first = Bytes::from_static(b"hello ");
        rope.push(first.clone());
        rope.push(Bytes::new());
        rope.push(Bytes::from_static(b"world"));
        assert_eq!(rope.peek(8).unwrap(), b"hello wo");
        assert!(rope.peek(12).is_none());
        let hel = rope.copy_to_bytes(3);
        assert_eq!(hel.as_ptr(), first.as_ptr(), "shared, not copied");
        assert_eq!(&rope.copy_to_bytes(5)[..], b"lo wo");
        assert_eq!(rope.remaining(), 3);
        rope.advance(1);
        assert_eq!(rope.chunk(), b"ld");
        assert_eq!(&rope.copy_to_bytes(2)[..], b"ld");
        assert_eq!((rope.remaining(), rope.chunk()), (0, &b""[..]));
    }

    #[test]
    fn messages_split_anywhere_decode_the_same() {
        let response = SampleStreamResponse {
            entries: vec![Default::default(); 3],
        };
        let mut wire = BytesMut::new();
        for _ in 0..2 {
            wire.put_u8(0);
            wire.put_u32(response.encoded_len() as u32);
            response.encode(&mut wire).unwrap();
        }
        let wire = wire.freeze();
        for cut in 0..wire.len() {
            let mut rope = Rope::default();
            rope.push(wire.slice(..cut));
            rope.push(wire.slice(cut..));
            for _ in 0..2 {
                let len = u32::from_be_bytes(rope.peek(HEADER).unwrap()[1..].try_into().unwrap());
                rope.advance(HEADER);
                let got = SampleStreamResponse::decode((&mut rope).take(len as usize)).unwrap();
                assert_eq!(got, response, "cut at {cut}");
            }
            assert_eq!(rope.remaining(), 0);
        }
    }
}
