//! Bounds the bytes a server holds of gRPC messages still arriving. A message is buffered
//! whole before it is decoded, so a peer that announces a large message and never finishes
//! it (or many such streams) would otherwise make the server hold up to the message limit per
//! stream. Each request body is counted as it arrives (its gRPC framing tells where messages
//! end); the bytes of unfinished messages are bounded per connection and per server, and a
//! stream that would pass either bound fails with RESOURCE_EXHAUSTED (its unfinished bytes
//! are released, nothing of it is stored, other streams go on).

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::server::TcpConnectInfo;
use tonic::Status;
use tower_service::Service;

/// The bytes of unfinished messages held, and the bounds.
#[derive(Debug)]
pub(crate) struct Budget {
    per_connection: usize,
    per_server: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_peer: HashMap<SocketAddr, usize>,
}

impl Budget {
    pub(crate) fn new(per_connection: usize, per_server: usize) -> Arc<Self> {
        Arc::new(Self {
            per_connection,
            per_server,
            held: Mutex::default(),
        })
    }

    /// Holds `n` more bytes for `peer`, unless that passes a bound.
    fn take(&self, peer: Option<SocketAddr>, n: usize) -> Result<(), Status> {
        let mut held = self.held.lock();
        let of_peer = peer.map_or(0, |p| held.by_peer.get(&p).copied().unwrap_or(0));
        if of_peer + n > self.per_connection {
            return Err(Status::resource_exhausted(format!(
                "This connection's messages in progress would hold {} bytes, more than the \
                 server's limit of {} per connection",
                of_peer + n,
                self.per_connection
            )));
        }
        if held.total + n > self.per_server {
            return Err(Status::resource_exhausted(format!(
                "Messages in progress would hold {} bytes, more than the server's limit of {}; \
                 try again later",
                held.total + n,
                self.per_server
            )));
        }
        held.total += n;
        if let Some(p) = peer {
            *held.by_peer.entry(p).or_default() += n;
        }
        Ok(())
    }

    /// Releases `n` bytes held for `peer`.
    fn give_back(&self, peer: Option<SocketAddr>, n: usize) {
        if n == 0 {
            return;
        }
        let mut held = self.held.lock();
        held.total -= n;
        if let Some(p) = peer {
            if let std::collections::hash_map::Entry::Occupied(mut e) = held.by_peer.entry(p) {
                *e.get_mut() -= n;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }

    /// Bytes of unfinished messages held now.
    #[cfg(test)]
    fn total(&self) -> usize {
        self.held.lock().total
    }
}

/// Where a body's gRPC framing stands: in a message header (5 bytes: compression flag and
/// length) or in a message's bytes.
#[derive(Debug, Default)]
struct Framing {
    header: [u8; 5],
    header_len: usize,
    /// Bytes of the current message still to come (after its header).
    remaining: usize,
    /// Bytes of the current (unfinished) message received so far, header included.
    partial: usize,
}

impl Framing {
    /// Follows `data`; returns how many bytes of unfinished messages it adds and releases:
    /// `(added, finished)`, where `finished` is what completed messages held before.
    fn advance(&mut self, mut data: &[u8]) -> (usize, usize) {
        let (mut added, mut finished) = (0, 0);
        while !data.is_empty() {
            if self.remaining == 0 {
                let n = (5 - self.header_len).min(data.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
                self.header_len += n;
                self.partial += n;
                added += n;
                data = &data[n..];
                if self.header_len < 5 {
                    break;
                }
                self.header_len = 0;
                let len = u32::from_be_bytes(self.header[1..5].try_into().expect("4 bytes"));
                self.remaining = len as usize;
                if self.remaining == 0 {
                    finished += std::mem::take(&mut self.partial);
                }
                continue;
            }
            let n = self.remaining.min(data.len());
            self.remaining -= n;
            self.partial += n;
            added += n;
            data = &data[n..];
            if self.remaining == 0 {
                finished += std::mem::take(&mut self.partial);
            }
        }
        (added, finished)
    }
}

/// A request body counted against the budget.
struct Counted {
    inner: Body,
    budget: Arc<Budget>,
    peer: Option<SocketAddr>,
    framing: Framing,
    /// Bytes this body holds of the budget.
    held: usize,
    /// Whether the budget refused it (it then ends).
    failed: bool,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let me = &mut *self;
        if me.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut me.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            let (added, finished) = me.framing.advance(data.chunk());
            // Bytes of messages that finished within this frame were never held.
            let within = finished.saturating_sub(me.held);
            let more = added - within;
            if let Err(status) = me.budget.take(me.peer, more) {
                me.budget.give_back(me.peer, std::mem::take(&mut me.held));
                me.failed = true;
                return Poll::Ready(Some(Err(status)));
            }
            me.held += more;
            let released = finished - within;
            me.budget.give_back(me.peer, released);
            me.held -= released;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.budget.give_back(self.peer, self.held);
    }
}

/// A gRPC service whose request bodies are counted against a [`Budget`].
#[derive(Clone)]
pub(crate) struct Budgeted<S> {
    inner: S,
    budget: Arc<Budget>,
}

impl<S> Budgeted<S> {
    pub(crate) fn new(inner: S, budget: Arc<Budget>) -> Self {
        Self { inner, budget }
    }
}

impl<S: NamedService> NamedService for Budgeted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Budgeted<S>
where
    S: Service<http::Request<Body>, Error = Infallible>,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let peer = request
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(|info| info.remote_addr());
        let budget = self.budget.clone();
        let request = request.map(|inner| {
            Body::new(Counted {
                inner,
                budget,
                peer,
                framing: Framing::default(),
                held: 0,
                failed: false,
            })
        });
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: usize) -> Vec<u8> {
        let mut out = vec![0u8];
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.extend(std::iter::repeat_n(7u8, len));
        out
    }

    #[test]
    fn framing_counts_only_unfinished_messages() {
        let mut f = Framing::default();
        let bytes = [message(10), message(0), message(3)].concat();
        // Byte by byte, the three messages finish at their last byte.
        let mut held = 0usize;
        let mut finished_at = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            let (added, finished) = f.advance(std::slice::from_ref(b));
            held = held + added - finished;
            if finished > 0 {
                finished_at.push((i, finished));
            }
        }
        assert_eq!(held, 0);
        assert_eq!(finished_at, vec![(14, 15), (19, 5), (27, 8)]);
        // All at once, plus a message in progress.
        let mut f = Framing::default();
        let mut data = bytes.clone();
        data.extend_from_slice(&message(100)[..50]);
        assert_eq!(f.advance(&data), (bytes.len() + 50, bytes.len()));
    }

    #[test]
    fn bounds_per_connection_and_per_server() {
        let budget = Budget::new(100, 150);
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "127.0.0.1:2".parse().unwrap();
        budget.take(Some(a), 100).unwrap();
        let err = budget.take(Some(a), 1).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(
            err.message().contains("per connection"),
            "{}",
            err.message()
        );
        budget.take(Some(b), 50).unwrap();
        let err = budget.take(Some(b), 1).unwrap_err();
        assert!(
            err.message().contains("try again later"),
            "{}",
            err.message()
        );
        budget.give_back(Some(a), 100);
        budget.take(Some(b), 50).unwrap();
        budget.give_back(Some(b), 100);
        assert_eq!(budget.total(), 0);
    }
}
