//! The wire protocol: every call of [`Server`] as the gRPC call of the same name on the
//! client's connection. `call` makes the `SampleStream` call by hand, decoding responses
//! straight from the received frames; `sample_stream` keeps such calls full of requests,
//! with the shared-memory ring when one is offered, and keeps idle ones open for the next
//! one-shot call.

mod call;
mod sample_stream;

pub(crate) use call::KeptStreams;

use crate::transport::{BoxFuture, InsertStream, SampleStream, SampleStreamOptions, Server};
use crate::{Client, ClientError, Result};
use reverb_proto::*;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Streaming};

/// A server reached over gRPC by `client`'s connection.
pub(crate) struct Grpc {
    client: Client,
}

impl Grpc {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }
}

impl Server for Grpc {
    fn reconnect_window(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// Waits until the server accepts connections (see [`Client::wait_reachable`]).
    fn ready<'a>(
        &'a self,
        what: &'a str,
        timeout: Option<Duration>,
        deadline: Option<Instant>,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.client.wait_until(what, timeout, deadline))
    }

    fn server_info(&self) -> BoxFuture<'_, Result<ServerInfoResponse>> {
        let mut stub = self.client.stub.clone();
        Box::pin(async move {
            let response = stub
                .server_info(ServerInfoRequest {})
                .await
                .map_err(|s| self.client.status(s))?;
            Ok(response.into_inner())
        })
    }

    fn mutate_priorities<'a>(
        &'a self,
        table: &'a str,
        updates: &'a [(u64, f64)],
        deletes: &'a [u64],
    ) -> BoxFuture<'a, Result<()>> {
        let request = MutatePrioritiesRequest {
            table: table.to_string(),
            updates: updates
                .iter()
                .map(|&(key, priority)| KeyWithPriority { key, priority })
                .collect(),
            delete_keys: deletes.to_vec(),
        };
        let mut stub = self.client.stub.clone();
        Box::pin(async move {
            stub.mutate_priorities(request)
                .await
                .map_err(|s| self.client.status(s))?;
            Ok(())
        })
    }

    fn reset<'a>(&'a self, table: &'a str) -> BoxFuture<'a, Result<()>> {
        let request = ResetRequest {
            table: table.to_string(),
        };
        let mut stub = self.client.stub.clone();
        Box::pin(async move {
            stub.reset(request)
                .await
                .map_err(|s| self.client.status(s))?;
            Ok(())
        })
    }

    fn checkpoint(&self) -> BoxFuture<'_, Result<String>> {
        let mut stub = self.client.stub.clone();
        Box::pin(async move {
            let response = stub
                .checkpoint(CheckpointRequest {})
                .await
                .map_err(|s| self.client.status(s))?;
            Ok(response.into_inner().checkpoint_path)
        })
    }

    fn insert_stream(&self) -> Box<dyn InsertStream> {
        // Unbounded, yet bounded in practice: writers keep a bounded number of items in
        // flight.
        let (requests, rx) = mpsc::unbounded_channel::<InsertStreamRequest>();
        let mut stub = self.client.stub.clone();
        let call = async move {
            stub.insert_stream(UnboundedReceiverStream::new(rx))
                .await
                .map(tonic::Response::into_inner)
        };
        // Some servers (the reference) answer headers only with their first response: the
        // call runs as a task of its own from now on, so what is sent reaches the server
        // even while nobody awaits a confirmation (a batch writer with room in flight).
        // Dropping the stream ends the task, as it would the call.
        let (call, task): (InsertCall, _) = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let task = runtime.spawn(call);
                let abort = task.abort_handle();
                let joined = async move {
                    task.await
                        .unwrap_or_else(|e| Err(tonic::Status::cancelled(e.to_string())))
                };
                (Box::pin(joined), Some(abort))
            }
            Err(_) => (Box::pin(call), None),
        };
        Box::new(GrpcInsertStream {
            client: self.client.clone(),
            requests,
            call: Some(call),
            task,
            responses: None,
        })
    }

    fn sample_stream(
        &self,
        table: &str,
        n: usize,
        rate_limiter_timeout: Option<Duration>,
        options: SampleStreamOptions,
    ) -> BoxFuture<'_, Result<Box<dyn SampleStream>>> {
        let request = SampleStreamRequest {
            columnar: options.columnar,
            ..sample_stream::request(table, n, rate_limiter_timeout)
        };
        Box::pin(async move {
            let stream =
                sample_stream::GrpcSampleStream::open(&self.client, request, n, options).await?;
            Ok(Box::new(stream) as Box<dyn SampleStream>)
        })
    }
}

type InsertCall =
    BoxFuture<'static, std::result::Result<Streaming<InsertStreamResponse>, tonic::Status>>;

/// An `InsertStream` call: requests are queued on its request side; confirmations are read
/// from its responses.
struct GrpcInsertStream {
    client: Client,
    requests: mpsc::UnboundedSender<InsertStreamRequest>,
    /// The call until the server answered it (then `responses`).
    call: Option<InsertCall>,
    /// The task running the call, ended with the stream.
    task: Option<tokio::task::AbortHandle>,
    responses: Option<Streaming<InsertStreamResponse>>,
}

impl Drop for GrpcInsertStream {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

impl InsertStream for GrpcInsertStream {
    fn max_request_bytes(&self) -> Option<usize> {
        Some(self.client.max_message_size())
    }

    fn send(&mut self, request: InsertStreamRequest) -> BoxFuture<'_, Result<()>> {
        let sent = self.requests.send(request).is_ok();
        Box::pin(async move {
            if sent {
                return Ok(());
            }
            // The call ended before this request: when the server never answered it (a
            // refused connection, a TLS handshake that failed), its status says why.
            if let Some(call) = self.call.as_mut() {
                let answered = call.await;
                self.call = None;
                match answered {
                    Ok(responses) => self.responses = Some(responses),
                    Err(status) => return Err(self.client.status(status)),
                }
            }
            Err(ClientError::new(
                Code::Unavailable,
                "the insert stream closed",
            ))
        })
    }

    fn confirmed(&mut self) -> BoxFuture<'_, Result<Option<Vec<u64>>>> {
        Box::pin(async move {
            loop {
                if let Some(responses) = &mut self.responses {
                    return match responses.message().await {
                        Ok(r) => Ok(r.map(|r| r.keys)),
                        Err(status) => Err(self.client.status(status)),
                    };
                }
                let Some(call) = self.call.as_mut() else {
                    return Err(ClientError::new(
                        Code::Unavailable,
                        "the insert stream failed",
                    ));
                };
                let answered = call.await;
                self.call = None;
                match answered {
                    Ok(responses) => self.responses = Some(responses),
                    Err(status) => return Err(self.client.status(status)),
                }
            }
        })
    }
}
