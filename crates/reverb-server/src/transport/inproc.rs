//! The in-process service: a client of this process calls the tables directly through
//! `reverb_proto::inproc::Service`, with the RPCs' checks and semantics (the same code: the
//! service's unary calls, `Inserter`, `sample_waiting`); sampled items are handed over as the
//! tables hold them, not copied.
//! `Server` registers one per server while it serves; once the server stops, every call and
//! every wait in progress ends with UNAVAILABLE.

use crate::auth::TokenCheck;
use crate::insert_stream::Inserter;
use crate::sample_stream::{sample_waiting, MAX_BATCH_ITEMS};
use crate::service::ReverbServiceImpl;
use crate::tables::Tables;
use reverb_core::Draw;
use reverb_proto::held::HeldSample;
use reverb_proto::inproc::{BoxFuture, InsertStream, SampledBatch, Service};
use reverb_proto::{InsertStreamRequest, ServerInfoResponse};
use std::time::Duration;
use tokio::sync::watch;
use tonic::Status;

/// Whether the server still serves: `true` once it stopped.
#[derive(Clone)]
pub(crate) struct Stopped(watch::Receiver<bool>);

impl Stopped {
    /// A flag and the sender that sets it.
    pub(crate) fn new() -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(false);
        (tx, Self(rx))
    }

    fn check(&self) -> Result<(), Status> {
        if *self.0.borrow() {
            return Err(stopped());
        }
        Ok(())
    }

    /// Completes once the server stopped.
    async fn wait(&self) {
        let mut rx = self.0.clone();
        // (An error means the sender is gone: the server is gone too.)
        let _ = rx.wait_for(|stopped| *stopped).await;
    }
}

fn stopped() -> Status {
    Status::unavailable("the server stopped")
}

/// A server's tables, as clients of this process reach them.
pub(crate) struct InProcServer {
    service: ReverbServiceImpl,
    stopped: Stopped,
    token_check: TokenCheck,
}

impl InProcServer {
    pub(crate) fn new(
        service: ReverbServiceImpl,
        stopped: Stopped,
        token_check: TokenCheck,
    ) -> Self {
        Self {
            service,
            stopped,
            token_check,
        }
    }
}

impl Service for InProcServer {
    fn accepts(&self, token: Option<&str>) -> bool {
        self.token_check.accepts(token)
    }

    fn insert_stream(&self) -> Box<dyn InsertStream> {
        Box::new(InProcInsert {
            tables: self.service.tables().clone(),
            stopped: self.stopped.clone(),
            inserter: Inserter::default(),
        })
    }

    fn sample<'a>(
        &'a self,
        table: &'a str,
        max_items: usize,
        rate_limiter_timeout: Option<Duration>,
        columns: bool,
    ) -> BoxFuture<'a, Result<SampledBatch, Status>> {
        Box::pin(async move {
            self.stopped.check()?;
            if max_items == 0 {
                return Err(Status::invalid_argument("num_samples must be > 0, got 0"));
            }
            let table = self.service.tables().get(table)?;
            let max_items = max_items.min(MAX_BATCH_ITEMS);
            let gone = self.stopped.wait();
            let is_gone = || self.stopped.check().is_err();
            // (Items are handed over, not copied into messages: no byte limit.)
            let drawn = sample_waiting(
                &table,
                max_items,
                usize::MAX,
                columns,
                rate_limiter_timeout,
                gone,
                is_gone,
            )
            .await
            .map_err(|e| e.unwrap_or_else(stopped))?;
            let batch = match drawn {
                Draw::Columns(batch) => return Ok(SampledBatch::Columns(batch)),
                Draw::Items(batch) => batch,
            };
            let batch = self.service.tables().resident(&table, batch)?;
            Ok(SampledBatch::Held(
                batch.into_iter().map(HeldSample::from).collect(),
            ))
        })
    }

    fn mutate_priorities(
        &self,
        table: &str,
        updates: &[(u64, f64)],
        deletes: &[u64],
    ) -> Result<(), Status> {
        self.stopped.check()?;
        self.service.mutate(table, updates, deletes)
    }

    fn reset(&self, table: &str) -> Result<(), Status> {
        self.stopped.check()?;
        self.service.reset(table)
    }

    fn server_info(&self) -> Result<ServerInfoResponse, Status> {
        self.stopped.check()?;
        Ok(self.service.info())
    }

    fn checkpoint(&self) -> BoxFuture<'_, Result<String, Status>> {
        Box::pin(async move {
            self.stopped.check()?;
            self.service.save_checkpoint().await
        })
    }
}

/// One in-process insert stream: `InsertStream`'s state and checks, without the wire.
struct InProcInsert {
    tables: Tables,
    stopped: Stopped,
    inserter: Inserter,
}

impl InsertStream for InProcInsert {
    fn insert(&mut self, request: InsertStreamRequest) -> BoxFuture<'_, Result<Vec<u64>, Status>> {
        Box::pin(async move {
            self.stopped.check()?;
            let stopped = self.stopped.clone();
            tokio::select! {
                r = self.inserter.handle(&self.tables, request) => r,
                // A wait on a full table ends with the server.
                _ = stopped.wait() => Err(self::stopped()),
            }
        })
    }
}
