//! `ReverbService`: the seven RPCs over gRPC. The unary calls' logic is shared with the
//! in-process service (`transport/inproc.rs`).

use crate::checkpointer::Checkpointer;
use crate::metrics::{StreamKind, Streams};
use crate::shm::RingWriter;
use crate::status::from_core;
use crate::tables::Tables;
use crate::{insert_stream, sample_stream};
use futures::Stream;
use reverb_core::{ChunkStore, Journal, Table};
use reverb_proto::reverb_service_server::ReverbService;
use reverb_proto::*;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The responses of a streaming call whose handler (`task`) sends them into a channel: the
/// stream drives the handler itself whenever it is polled for the next response, rather than
/// the handler running as a task of its own. A response then leaves in the poll that made it:
/// one task wake-up less per round trip. Dropping the stream (the client went away) drops
/// the handler.
struct Driven<T> {
    responses: mpsc::Receiver<Result<T, Status>>,
    task: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl<T: Send + 'static> Driven<T> {
    /// Responses of the handler `start` makes from the channel's sending side.
    fn start<F>(
        capacity: usize,
        start: impl FnOnce(mpsc::Sender<Result<T, Status>>) -> F,
    ) -> BoxStream<T>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (tx, responses) = mpsc::channel(capacity);
        Box::pin(Driven {
            responses,
            task: Some(Box::pin(start(tx))),
        })
    }
}

impl<T> Stream for Driven<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let me = &mut *self;
        loop {
            if let Poll::Ready(response) = me.responses.poll_recv(cx) {
                return Poll::Ready(response);
            }
            let Some(task) = me.task.as_mut() else {
                // The handler ended and every response was taken (its sender is gone).
                return Poll::Ready(None);
            };
            if task.as_mut().poll(cx).is_ready() {
                me.task = None;
                continue;
            }
            // The handler waits; what it sent before waiting goes out now.
            return me.responses.poll_recv(cx);
        }
    }
}

/// What this server understands beyond the reference's protocol, listed in
/// `ServerInfoResponse.features`: `item_runs`, items in runs (`InsertStreamRequest.item_runs`).
pub const FEATURES: &[&str] = &["item_runs"];

/// The service: a fixed set of tables, shared with whoever else holds them.
#[derive(Clone)]
pub struct ReverbServiceImpl {
    tables: Tables,
    tables_state_id: Uint128,
    checkpointer: Option<Arc<Checkpointer>>,
    streams: Arc<Streams>,
}

impl ReverbServiceImpl {
    /// Serves `tables`; names must be unique.
    pub fn new(tables: Vec<Arc<Table>>) -> Result<Self, String> {
        Ok(Self {
            tables: Tables::new(tables)?,
            tables_state_id: Uint128 {
                high: rand::random(),
                low: rand::random(),
            },
            checkpointer: None,
            streams: Arc::default(),
        })
    }

    /// The open gRPC streams, by kind.
    pub fn streams(&self) -> &Arc<Streams> {
        &self.streams
    }

    /// Saves checkpoints with `checkpointer` when asked (the `Checkpoint` RPC).
    pub fn with_checkpointer(mut self, checkpointer: Arc<Checkpointer>) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// Keeps the tables' chunk payloads in `store` and their changes in `journal` (on disk;
    /// with `always`, inserts are confirmed once durable).
    pub fn with_storage(
        mut self,
        store: Arc<ChunkStore>,
        journal: Arc<Journal>,
        always: bool,
    ) -> Self {
        self.tables = self.tables.with_storage(store, journal, always);
        self
    }

    /// The tables, by name.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// `ServerInfo` (with [`FEATURES`]).
    pub(crate) fn info(&self) -> ServerInfoResponse {
        ServerInfoResponse {
            tables_state_id: Some(self.tables_state_id),
            table_info: self.tables.iter().map(|t| t.info()).collect(),
            features: FEATURES.iter().map(|f| f.to_string()).collect(),
        }
    }

    /// `MutatePriorities`: deletes, then updates.
    pub(crate) fn mutate(
        &self,
        table: &str,
        updates: &[(u64, f64)],
        deletes: &[u64],
    ) -> Result<(), Status> {
        self.tables
            .get(table)?
            .mutate_items(updates, deletes)
            .map_err(from_core)
    }

    /// `Reset`.
    pub(crate) fn reset(&self, table: &str) -> Result<(), Status> {
        self.tables.get(table)?.reset();
        Ok(())
    }

    /// `Checkpoint`: saves every table (on the blocking pool); returns the path.
    pub(crate) async fn save_checkpoint(&self) -> Result<String, Status> {
        let checkpointer = self.checkpointer.clone().ok_or_else(|| {
            Status::invalid_argument("This server has no checkpointer configured.")
        })?;
        let tables = self.tables.to_vec();
        let report = tokio::task::spawn_blocking(move || checkpointer.save(&tables))
            .await
            .map_err(|e| Status::internal(format!("checkpoint task failed: {e}")))?
            .map_err(Status::internal)?;
        Ok(report.path.to_string_lossy().into_owned())
    }
}

#[tonic::async_trait]
impl ReverbService for ReverbServiceImpl {
    async fn checkpoint(
        &self,
        _request: Request<CheckpointRequest>,
    ) -> Result<Response<CheckpointResponse>, Status> {
        Ok(Response::new(CheckpointResponse {
            checkpoint_path: self.save_checkpoint().await?,
        }))
    }

    type InsertStreamStream = BoxStream<InsertStreamResponse>;

    async fn insert_stream(
        &self,
        request: Request<Streaming<InsertStreamRequest>>,
    ) -> Result<Response<Self::InsertStreamStream>, Status> {
        let open = self.streams.open(StreamKind::Insert);
        let (tables, inbound) = (self.tables.clone(), request.into_inner());
        Ok(Response::new(Driven::start(8, |tx| async move {
            insert_stream::run(tables, inbound, tx).await;
            drop(open);
        })))
    }

    async fn mutate_priorities(
        &self,
        request: Request<MutatePrioritiesRequest>,
    ) -> Result<Response<MutatePrioritiesResponse>, Status> {
        let req = request.into_inner();
        let updates: Vec<(u64, f64)> = req.updates.iter().map(|u| (u.key, u.priority)).collect();
        self.mutate(&req.table, &updates, &req.delete_keys)?;
        Ok(Response::new(MutatePrioritiesResponse {}))
    }

    async fn reset(
        &self,
        request: Request<ResetRequest>,
    ) -> Result<Response<ResetResponse>, Status> {
        ReverbServiceImpl::reset(self, &request.into_inner().table)?;
        Ok(Response::new(ResetResponse {}))
    }

    type SampleStreamStream = BoxStream<SampleStreamResponse>;

    async fn sample_stream(
        &self,
        request: Request<Streaming<SampleStreamRequest>>,
    ) -> Result<Response<Self::SampleStreamStream>, Status> {
        // A client on this host may offer a shared-memory ring for chunk bytes.
        let ring = request
            .metadata()
            .get(reverb_proto::shm::METADATA_KEY)
            .and_then(|offer| offer.to_str().ok())
            .and_then(RingWriter::open);
        let open = self.streams.open(StreamKind::Sample);
        let (tables, inbound) = (self.tables.clone(), request.into_inner());
        Ok(Response::new(Driven::start(3, |tx| async move {
            sample_stream::run(tables, inbound, tx, ring).await;
            drop(open);
        })))
    }

    async fn server_info(
        &self,
        _request: Request<ServerInfoRequest>,
    ) -> Result<Response<ServerInfoResponse>, Status> {
        Ok(Response::new(self.info()))
    }

    type InitializeConnectionStream = BoxStream<InitializeConnectionResponse>;

    /// The reference's in-process shortcut; we always answer address 0 ("use gRPC").
    async fn initialize_connection(
        &self,
        request: Request<Streaming<InitializeConnectionRequest>>,
    ) -> Result<Response<Self::InitializeConnectionStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                let reply = match inbound.message().await {
                    Ok(Some(_)) => Ok(InitializeConnectionResponse { address: 0 }),
                    Ok(None) => break,
                    // A message that does not decode: say so, then stop.
                    Err(status) => Err(status),
                };
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
