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
        for item in requests.iter().flat_map(|r| r.items.iter()) {
            PrioritizedItem::decode(item.clone()).map_err(|e| {
                ClientError::invalid(format!("An item is not a PrioritizedItem message: {e}"))
            })?;
        }
        let keys = crate::writer::runs::item_count(&requests);
        let requests = &requests;
        self.with_deadline("InsertStream", timeout, |server| async move {
            // The stream the last insert left open, if any. One the server has closed since
            // (a restart, say) fails before confirming anything, and the insert is made
            // again on a new stream; any other failure (a refusal, or one after some items
            // were stored) is the call's: nothing is sent twice.
            let kept = self.kept_insert.lock().take();
            if let Some(mut stream) = kept {
                let mut confirmed = 0;
                match self
                    .insert_on(&mut *stream, requests, keys, &mut confirmed)
                    .await
                {
                    Ok(()) => {
                        self.kept_insert.lock().get_or_insert(stream);
                        return Ok(());
                    }
                    Err(e) if confirmed > 0 || !closed(&e) => return Err(e),
                    Err(_) => {}
                }
            }
            let mut stream = server.insert_stream();
            self.insert_on(&mut *stream, requests, keys, &mut 0).await?;
            self.kept_insert.lock().get_or_insert(stream);
            Ok(())
        })
        .await
    }

    /// Sends `requests` on `stream` and waits until the server confirmed their `keys` items
    /// (a stream confirms only what was sent on it), counting them in `confirmed`.
    async fn insert_on(
        &self,
        stream: &mut dyn crate::transport::InsertStream,
        requests: &[InsertStreamRequest],
        keys: usize,
        confirmed: &mut usize,
    ) -> Result<()> {
        for request in requests {
            stream.send(request.clone()).await?;
        }
        let mut pending = keys;
        while pending > 0 {
            let Some(confirmed_now) = stream.confirmed().await? else {
                return Err(ClientError::new(
                    Code::Internal,
                    format!(
                        "Server at {} closed the insert stream before confirming every item",
                        self.address()
                    ),
                ));
            };
            pending = pending.saturating_sub(confirmed_now.len());
            *confirmed += confirmed_now.len();
        }
        Ok(())
    }
}

/// Whether `e` says the stream or its connection was closed (rather than that the server
/// refused what was sent).
pub(crate) fn closed(e: &ClientError) -> bool {
    e.unsent
        || matches!(
            e.code,
            Code::Unavailable | Code::Cancelled | Code::Aborted | Code::Unknown | Code::Internal
        )
}
