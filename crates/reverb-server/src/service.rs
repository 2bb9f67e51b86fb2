//! `ReverbService`: the seven RPCs.

use crate::checkpointer::Checkpointer;
use crate::shm::RingWriter;
use crate::{insert, sample, status};
use futures::Stream;
use reverb_core::Table;
use reverb_proto::reverb_service_server::ReverbService;
use reverb_proto::*;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The service: a fixed set of tables, shared with whoever else holds them.
#[derive(Clone)]
pub struct ReverbServiceImpl {
    tables: Arc<BTreeMap<String, Arc<Table>>>,
    tables_state_id: Uint128,
    checkpointer: Option<Arc<Checkpointer>>,
}

impl ReverbServiceImpl {
    /// The tables by name.
    pub(crate) fn tables_map(&self) -> Arc<BTreeMap<String, Arc<Table>>> {
        self.tables.clone()
    }

    /// Serves `tables`; names must be unique.
    pub fn new(tables: Vec<Arc<Table>>) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for t in tables {
            let name = t.name().to_string();
            if map.insert(name.clone(), t).is_some() {
                return Err(format!(
                    "Table names must be unique; '{name}' appears more than once"
                ));
            }
        }
        if map.is_empty() {
            return Err("At least one table must be provided".to_string());
        }
        let tables_state_id = Uint128 {
            high: rand::random(),
            low: rand::random(),
        };
        Ok(Self {
            tables: Arc::new(map),
            tables_state_id,
            checkpointer: None,
        })
    }

    /// Saves checkpoints with `checkpointer` when asked (the `Checkpoint` RPC).
    pub fn with_checkpointer(mut self, checkpointer: Arc<Checkpointer>) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// The tables, by name.
    pub fn tables(&self) -> &Arc<BTreeMap<String, Arc<Table>>> {
        &self.tables
    }
}

/// Finds a table or says which ones exist.
pub(crate) fn find_table(
    tables: &BTreeMap<String, Arc<Table>>,
    name: &str,
) -> Result<Arc<Table>, Status> {
    tables.get(name).cloned().ok_or_else(|| {
        let known: Vec<&str> = tables.keys().map(String::as_str).collect();
        Status::not_found(format!(
            "Priority table {name} was not found. Available tables: [{}]",
            known.join(", ")
        ))
    })
}

#[tonic::async_trait]
impl ReverbService for ReverbServiceImpl {
    async fn checkpoint(
        &self,
        _request: Request<CheckpointRequest>,
    ) -> Result<Response<CheckpointResponse>, Status> {
        let checkpointer = self.checkpointer.clone().ok_or_else(|| {
            Status::invalid_argument("This server has no checkpointer configured.")
        })?;
        let tables: Vec<Arc<Table>> = self.tables.values().cloned().collect();
        let report = tokio::task::spawn_blocking(move || checkpointer.save(&tables))
            .await
            .map_err(|e| Status::internal(format!("checkpoint task failed: {e}")))?
            .map_err(Status::internal)?;
        Ok(Response::new(CheckpointResponse {
            checkpoint_path: report.path.to_string_lossy().into_owned(),
        }))
    }

    type InsertStreamStream = BoxStream<InsertStreamResponse>;

    async fn insert_stream(
        &self,
        request: Request<Streaming<InsertStreamRequest>>,
    ) -> Result<Response<Self::InsertStreamStream>, Status> {
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(insert::run(self.tables.clone(), request.into_inner(), tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn mutate_priorities(
        &self,
        request: Request<MutatePrioritiesRequest>,
    ) -> Result<Response<MutatePrioritiesResponse>, Status> {
        let req = request.into_inner();
        let table = find_table(&self.tables, &req.table)?;
        let updates: Vec<(u64, f64)> = req.updates.iter().map(|u| (u.key, u.priority)).collect();
        table
            .mutate_items(&updates, &req.delete_keys)
            .map_err(status)?;
        Ok(Response::new(MutatePrioritiesResponse {}))
    }

    async fn reset(
        &self,
        request: Request<ResetRequest>,
    ) -> Result<Response<ResetResponse>, Status> {
        find_table(&self.tables, &request.into_inner().table)?.reset();
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
        let (tx, rx) = mpsc::channel(3);
        tokio::spawn(sample::run(
            self.tables.clone(),
            request.into_inner(),
            tx,
            ring,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn server_info(
        &self,
        _request: Request<ServerInfoRequest>,
    ) -> Result<Response<ServerInfoResponse>, Status> {
        Ok(Response::new(ServerInfoResponse {
            tables_state_id: Some(self.tables_state_id),
            table_info: self.tables.values().map(|t| t.info()).collect(),
        }))
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
            while let Ok(Some(_)) = inbound.message().await {
                if tx
                    .send(Ok(InitializeConnectionResponse { address: 0 }))
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
