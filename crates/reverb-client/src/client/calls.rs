//! The calls of a [`Client`]: unary calls and one-shot inserts, each bounded by a deadline
//! and written once against [`Client::server`]. (One-shot sampling, `Client::sample`, is the
//! sampler's: `sampler/one_shot.rs`.)

use super::Client;
use crate::{ClientError, Result};
use prost::Message;
use reverb_proto::*;
use std::time::Duration;
use tonic::Code;

impl Client {
    /// `ServerInfo`: every table's `TableInfo`.
    pub async fn server_info(&self, timeout: Option<Duration>) -> Result<Vec<TableInfo>> {
        Ok(self.server_info_response(timeout).await?.table_info)
    }

    /// `ServerInfo` whole: the tables, and what the server understands beyond the
    /// reference's protocol (`features`; empty for the reference's servers).
    pub async fn server_info_response(
        &self,
        timeout: Option<Duration>,
    ) -> Result<ServerInfoResponse> {
        self.with_deadline("ServerInfo", timeout, |server| async move {
            server.server_info().await
        })
        .await
    }

    /// `MutatePriorities`: deletes, then updates; unknown keys are ignored by the server.
    pub async fn mutate_priorities(
        &self,
        table: &str,
        updates: Vec<(u64, f64)>,
        deletes: Vec<u64>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let (updates, deletes) = (&updates, &deletes);
        self.with_deadline("MutatePriorities", timeout, |server| async move {
            server.mutate_priorities(table, updates, deletes).await
        })
        .await
    }

    /// `Reset`: empties a table.
    pub async fn reset(&self, table: &str, timeout: Option<Duration>) -> Result<()> {
        self.with_deadline("Reset", timeout, |server| async move {
            server.reset(table).await
        })
        .await
    }

    /// `Checkpoint`: returns the path the server wrote.
    pub async fn checkpoint(&self, timeout: Option<Duration>) -> Result<String> {
        self.with_deadline("Checkpoint", timeout, |server| async move {
            server.checkpoint().await
        })
        .await
    }

    /// Sends requests on one `InsertStream` and waits until every item (those of its item
    /// runs too) is confirmed. Every item must be an encoded `PrioritizedItem` (else
    /// INVALID_ARGUMENT, nothing sent); item runs go only to servers that take them (see
    /// [`Client::takes_item_runs`]).
    pub async fn insert_requests(
        &self,
        requests: Vec<InsertStreamRequest>,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let mut keys = reverb_proto::KeySet::default();
        for item in requests.iter().flat_map(|r| r.items.iter()) {
            let item = PrioritizedItem::decode(item.clone()).map_err(|e| {
                ClientError::invalid(format!("An item is not a PrioritizedItem message: {e}"))
            })?;
            keys.insert(item.key);
        }
        let runs = requests.iter().flat_map(|r| r.item_runs.iter());
        keys.extend(runs.flat_map(|run| run.keys.iter().copied()));
        let (requests, keys) = (&requests, &keys);
        self.with_deadline("InsertStream", timeout, |server| async move {
            let mut stream = server.insert_stream();
            for request in requests {
                stream.send(request.clone()).await?;
            }
            let mut pending = keys.clone();
            while !pending.is_empty() {
                let Some(confirmed) = stream.confirmed().await? else {
                    return Err(ClientError::new(
                        Code::Internal,
                        format!(
                            "Server at {} closed the insert stream before confirming every item",
                            self.address()
                        ),
                    ));
                };
                for key in confirmed {
                    pending.remove(&key);
                }
            }
            Ok(())
        })
        .await
    }
}
