//! The `InsertStream` RPC. Protocol: the client sends `InsertStreamRequest`s, each with chunks
//! (stored for this stream), items (slices of the stream's chunks, inserted in order) and
//! `keep_chunk_keys` (the chunks the stream keeps after the request; the rest are dropped).
//! The server answers each request that inserted items with their keys, once stored; while a
//! table's rate limiter blocks, it waits (reading no further requests). A bad request ends the
//! stream with an error; nothing of a rejected item is stored.
//!
//! [`Inserter`] is one stream's state, shared by the gRPC stream and the in-process one.

use crate::status::from_core;
use crate::tables::Tables;
use reverb_core::chunk::ItemError;
use reverb_core::{Chunk, InsertOutcome, ItemData, Table, Waiter};
use reverb_proto::payload::{chunk_layouts, Layouts};
use reverb_proto::{
    decode_item, ChunkData, InsertStreamRequest, InsertStreamResponse, KeyHashMap, KeySet,
    PrioritizedItem,
};
use std::sync::Arc;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

type Tx = mpsc::Sender<Result<InsertStreamResponse, Status>>;

/// Serves one gRPC insert stream until the client closes it or it fails.
pub(crate) async fn run(tables: Tables, mut inbound: Streaming<InsertStreamRequest>, tx: Tx) {
    let mut inserter = Inserter::default();
    loop {
        let request = match inbound.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            // A malformed message (or a broken connection): say so, then stop reading.
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
        };
        // Waiting on the rate limiter ends when the client goes away.
        let result = tokio::select! {
            r = inserter.handle(&tables, request) => r,
            _ = tx.closed() => return,
        };
        match result {
            Ok(keys) if keys.is_empty() => {}
            Ok(keys) => {
                if tx.send(Ok(InsertStreamResponse { keys })).await.is_err() {
                    return;
                }
            }
            Err(status) => {
                let _ = tx.send(Err(status)).await;
                return;
            }
        }
    }
}

/// The state of one insert stream: the chunks the client asked the server to keep.
#[derive(Default)]
pub(crate) struct Inserter {
    chunks: KeyHashMap<Received>,
    /// The message each received item is decoded into, kept (with its string and vectors)
    /// between items.
    item: PrioritizedItem,
}

/// A chunk of the stream and what its tensors are, so items can be checked against it.
struct Received {
    chunk: Arc<Chunk>,
    tensors: Layouts,
}

impl Inserter {
    /// Stores a request's chunks and inserts its items (waiting while a rate limiter blocks:
    /// callers stop the wait by dropping the future); returns the confirmed keys.
    pub(crate) async fn handle(
        &mut self,
        tables: &Tables,
        request: InsertStreamRequest,
    ) -> Result<Vec<u64>, Status> {
        if request.chunks.is_empty() && request.items.is_empty() {
            return Err(Status::invalid_argument(
                "InsertStreamRequest must contain at least one chunk or item",
            ));
        }
        // Every chunk is checked before any is kept, and every item before any is inserted: a
        // rejected request inserts nothing (and ends the stream, with the chunks it kept).
        let mut received = Vec::with_capacity(request.chunks.len());
        for data in request.chunks {
            received.push(check_chunk(data)?);
        }
        for r in received {
            self.chunks.insert(r.chunk.key(), r);
        }
        let mut resolved = Vec::with_capacity(request.items.len());
        let item = &mut self.item;
        for bytes in &request.items {
            decode_item(bytes, item).map_err(|e| {
                Status::invalid_argument(format!("An item could not be decoded: {e}"))
            })?;
            let table = tables.get(&item.table)?;
            let priority = item.priority;
            table.check_priority(priority).map_err(from_core)?;
            resolved.push((table, resolve(item, &self.chunks)?, priority));
        }
        let mut confirmed = Vec::with_capacity(resolved.len());
        for (table, item, priority) in resolved {
            let key = item.key;
            insert_waiting(&table, item, priority).await?;
            confirmed.push(key);
        }
        if !request.keep_chunk_keys.is_empty() || !confirmed.is_empty() {
            let keep: KeySet = request.keep_chunk_keys.into_iter().collect();
            self.chunks.retain(|k, _| keep.contains(k));
        }
        Ok(confirmed)
    }
}

/// Reads a received chunk's tensor headers (not its data): a chunk no sampler could decode is
/// refused.
fn check_chunk(data: ChunkData) -> Result<Received, Status> {
    let tensors = chunk_layouts(&data).map_err(|e| Status::invalid_argument(e.message))?;
    Ok(Received {
        chunk: Arc::new(Chunk::new(data)),
        tensors,
    })
}

/// Checks an item's trajectory against the chunks it references (every slice within its
/// tensor's rows, every column of one dtype and row shape) and attaches those chunks.
fn resolve(item: &PrioritizedItem, chunks: &KeyHashMap<Received>) -> Result<ItemData, Status> {
    ItemData::checked(item, |key| {
        chunks.get(&key).map(|r| (&r.chunk, &r.tensors[..]))
    })
    .map_err(|e| match e {
        ItemError::MissingChunk(chunk) => Status::invalid_argument(format!(
            "Could not find sequence chunk {chunk} referenced by item {}",
            item.key
        )),
        ItemError::Invalid(what) => Status::invalid_argument(what),
    })
}

/// Inserts, waiting while the rate limiter blocks.
async fn insert_waiting(table: &Table, item: ItemData, priority: f64) -> Result<(), Status> {
    // Most inserts are not blocked: they register for the table's changes only once one is
    // (registering takes the notifier's lock twice, for every item of a busy stream).
    let mut item = match table.try_insert(item, priority).map_err(from_core)? {
        InsertOutcome::Blocked(back) => back,
        _ => return Ok(()),
    };
    let _waiting = table.waiting(Waiter::Insert);
    loop {
        let notified = table.changed().notified();
        tokio::pin!(notified);
        // Registered before trying again, so a change after this attempt wakes the wait.
        notified.as_mut().enable();
        match table.try_insert(item, priority).map_err(from_core)? {
            InsertOutcome::Blocked(back) => item = back,
            _ => return Ok(()),
        }
        notified.await;
    }
}
