//! Reaching a server of this process without gRPC.
//!
//! A client of the same binary as the server finds it in `reverb_proto::inproc`'s registry
//! ([`crate::Client::inproc`]). The TensorFlow kernels are a library of their own, whose
//! registry is always empty: they sample the Python extension's servers through a small C ABI
//! the extension exports ([`abi`]), borrowing the chunk bytes instead of copying them.

use crate::sample::{Columns, Sampled};
use crate::{ClientError, Result};
use std::time::Duration;

/// The port of `address` if it names this machine (`localhost`, `127.0.0.1`, `[::1]`, ...),
/// with an optional `http://` scheme.
pub fn loopback_port(address: &str) -> Option<u16> {
    let rest = address.split_once("://").map_or(address, |(_, r)| r);
    let (host, port) = rest.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    matches!(host, "localhost" | "127.0.0.1" | "::1" | "0.0.0.0" | "::")
        .then(|| port.trim_end_matches('/').parse().ok())
        .flatten()
}

pub mod abi;

use crate::transport::{BoxFuture, InsertStream, SampleStream, SampleStreamOptions, Server};
use reverb_proto::inproc::{SampledBatch, Service};
use reverb_proto::{InsertStreamRequest, SampleBatch, ServerInfoResponse};
use std::collections::VecDeque;
use std::sync::Arc;

/// A server of this process, called directly: sampled items are handed over as the server
/// holds them, not copied through protobuf, HTTP/2 and a socket.
pub(crate) struct InProc {
    service: Arc<dyn Service>,
    /// Where it was found, and the token the client holds: a stream opened after the server
    /// stopped looks for a server restarted there.
    port: u16,
    token: Option<String>,
    /// The address the client was given (for errors).
    address: Arc<str>,
}

impl InProc {
    pub(crate) fn new(
        service: Arc<dyn Service>,
        port: u16,
        token: Option<&str>,
        address: &str,
    ) -> Self {
        Self {
            service,
            port,
            token: token.map(str::to_string),
            address: address.into(),
        }
    }

    /// The server on the port now, or the one first found (a stopped server answers every
    /// call with UNAVAILABLE).
    fn current(&self) -> Arc<dyn Service> {
        reverb_proto::inproc::lookup(self.port)
            .filter(|s| s.accepts(self.token.as_deref()))
            .unwrap_or_else(|| self.service.clone())
    }
}

/// An error of a server of this process at `address`.
fn error(address: &str) -> impl Fn(tonic::Status) -> ClientError + '_ {
    move |status| ClientError::from_inproc(status, address)
}

impl Server for InProc {
    fn reconnect_window(&self) -> Duration {
        Duration::from_secs(2)
    }

    fn server_info(&self) -> BoxFuture<'_, Result<ServerInfoResponse>> {
        let info = self.service.server_info().map_err(error(&self.address));
        Box::pin(async move { info })
    }

    fn mutate_priorities<'a>(
        &'a self,
        table: &'a str,
        updates: &'a [(u64, f64)],
        deletes: &'a [u64],
    ) -> BoxFuture<'a, Result<()>> {
        let done = self
            .service
            .mutate_priorities(table, updates, deletes)
            .map_err(error(&self.address));
        Box::pin(async move { done })
    }

    fn reset<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<()>> {
        let done = self.service.reset(table).map_err(error(&self.address));
        Box::pin(async move { done })
    }

    fn checkpoint(&self) -> BoxFuture<'_, Result<String>> {
        Box::pin(async move {
            self.service
                .checkpoint()
                .await
                .map_err(error(&self.address))
        })
    }

    fn insert_stream(&self) -> Box<dyn InsertStream> {
        Box::new(InProcInsertStream {
            stream: self.current().insert_stream(),
            address: self.address.clone(),
            handled: VecDeque::new(),
            failed: false,
        })
    }

    fn sample_stream(
        &self,
        table: &str,
        n: usize,
        rate_limiter_timeout: Option<Duration>,
        options: SampleStreamOptions,
    ) -> BoxFuture<'_, Result<Box<dyn SampleStream>>> {
        let source = Direct {
            service: self.current(),
            address: self.address.clone(),
            columns: options.columnar,
        };
        let stream = batches(source, table, n, rate_limiter_timeout);
        Box::pin(async move { Ok(stream) })
    }
}

/// An insert stream to a server of this process: each request is handled (and its items
/// confirmed) when it is sent; what it came to is read, in order, from `confirmed`. As on a
/// gRPC stream, a request the server refused ends the stream: later ones are not handled.
struct InProcInsertStream {
    stream: Box<dyn reverb_proto::inproc::InsertStream>,
    address: Arc<str>,
    /// What each request handled came to, not yet taken by `confirmed`.
    handled: VecDeque<Result<Vec<u64>>>,
    /// A request was refused.
    failed: bool,
}

impl InsertStream for InProcInsertStream {
    fn max_request_bytes(&self) -> Option<usize> {
        None // (nothing is encoded into a message)
    }

    fn send(&mut self, request: InsertStreamRequest) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            if !self.failed {
                let handled = self
                    .stream
                    .insert(request)
                    .await
                    .map_err(error(&self.address));
                self.failed = handled.is_err();
                self.handled.push_back(handled);
            }
            Ok(())
        })
    }

    fn confirmed(&mut self) -> BoxFuture<'_, Result<Option<Vec<u64>>>> {
        Box::pin(async move {
            match self.handled.pop_front() {
                Some(handled) => handled.map(Some),
                None => std::future::pending().await,
            }
        })
    }
}

/// Samples asked for and not yet served, in order: `(table, count, rate-limiter timeout)`.
#[derive(Default)]
struct Requests(VecDeque<(String, usize, Option<Duration>)>);

impl Requests {
    fn add(&mut self, table: &str, n: usize, rate_limiter_timeout: Option<Duration>) {
        match self.0.back_mut() {
            Some((t, count, timeout)) if t == table && *timeout == rate_limiter_timeout => {
                *count += n
            }
            _ => self
                .0
                .push_back((table.to_string(), n, rate_limiter_timeout)),
        }
    }

    /// Counts `served` samples of the oldest request.
    fn served(&mut self, served: usize) {
        if let Some((_, count, _)) = self.0.front_mut() {
            *count = count.saturating_sub(served);
            if *count == 0 {
                self.0.pop_front();
            }
        }
    }
}

/// Where a sample stream of this process takes its batches from: up to `n` samples of
/// `table` at once, at least one, each waiting for the rate limiter at most `timeout`.
trait Batches: Send + 'static {
    fn batch<'a>(
        &'a self,
        table: &'a str,
        n: usize,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<Vec<Result<Sampled>>>>;
}

/// A server of this process called directly.
struct Direct {
    service: Arc<dyn Service>,
    address: Arc<str>,
    /// Batches may come as columns (see [`SampleStreamOptions::columnar`]).
    columns: bool,
}

impl Batches for Direct {
    fn batch<'a>(
        &'a self,
        table: &'a str,
        n: usize,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<Vec<Result<Sampled>>>> {
        Box::pin(async move {
            let batch = self
                .service
                .sample(table, n, timeout, self.columns)
                .await
                .map_err(error(&self.address))?;
            Ok(match batch {
                SampledBatch::Held(held) => {
                    held.into_iter().map(|s| Ok(Sampled::Held(s))).collect()
                }
                SampledBatch::Columns(batch) => Columns::rows(SampleBatch::from(batch))?
                    .into_iter()
                    .map(Ok)
                    .collect(),
            })
        })
    }
}

impl Batches for abi::Exported {
    fn batch<'a>(
        &'a self,
        table: &'a str,
        n: usize,
        timeout: Option<Duration>,
    ) -> BoxFuture<'a, Result<Vec<Result<Sampled>>>> {
        Box::pin(async move {
            let batch = self.sample(table, n, timeout).await?;
            Ok(batch.into_iter().map(|s| Ok(Sampled::Planned(s))).collect())
        })
    }
}

/// A sample stream of this process opened with its first request.
fn batches<B: Batches>(
    source: B,
    table: &str,
    n: usize,
    rate_limiter_timeout: Option<Duration>,
) -> Box<dyn SampleStream> {
    let mut requests = Requests::default();
    requests.add(table, n, rate_limiter_timeout);
    Box::new(BatchStream { source, requests })
}

/// A sample stream of this process: each `next` takes what is ready of the oldest request
/// in one batch (the server waits for the rate limiter as for a stream).
struct BatchStream<B> {
    source: B,
    requests: Requests,
}

impl<B: Batches> SampleStream for BatchStream<B> {
    fn requests_are_free(&self) -> bool {
        true
    }

    fn request(
        &mut self,
        table: &str,
        n: usize,
        rate_limiter_timeout: Option<Duration>,
    ) -> Result<()> {
        self.requests.add(table, n, rate_limiter_timeout);
        Ok(())
    }

    fn next(&mut self) -> BoxFuture<'_, Result<Vec<Result<Sampled>>>> {
        Box::pin(async move {
            let Some((table, n, timeout)) = self.requests.0.front() else {
                return std::future::pending().await;
            };
            let batch = self.source.batch(table, *n, *timeout).await?;
            self.requests.served(batch.len());
            Ok(batch)
        })
    }
}

/// A server of this process held by another library (the Python extension, seen from the
/// TensorFlow kernels): sampled through that library's C ABI ([`abi`]); other calls go over
/// gRPC.
pub(crate) struct Abi {
    pub(crate) exported: abi::Exported,
    pub(crate) grpc: crate::transport::grpc::Grpc,
}

impl Server for Abi {
    fn reconnect_window(&self) -> Duration {
        Duration::ZERO // (a stopped server is not looked for again)
    }

    fn server_info(&self) -> BoxFuture<'_, Result<ServerInfoResponse>> {
        self.grpc.server_info()
    }

    fn mutate_priorities<'a>(
        &'a self,
        table: &'a str,
        updates: &'a [(u64, f64)],
        deletes: &'a [u64],
    ) -> BoxFuture<'a, Result<()>> {
        self.grpc.mutate_priorities(table, updates, deletes)
    }

    fn reset<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<()>> {
        self.grpc.reset(table)
    }

    fn checkpoint(&self) -> BoxFuture<'_, Result<String>> {
        self.grpc.checkpoint()
    }

    fn insert_stream(&self) -> Box<dyn InsertStream> {
        self.grpc.insert_stream()
    }

    fn sample_stream(
        &self,
        table: &str,
        n: usize,
        rate_limiter_timeout: Option<Duration>,
        _: SampleStreamOptions,
    ) -> BoxFuture<'_, Result<Box<dyn SampleStream>>> {
        let stream = batches(self.exported, table, n, rate_limiter_timeout);
        Box::pin(async move { Ok(stream) })
    }
}
