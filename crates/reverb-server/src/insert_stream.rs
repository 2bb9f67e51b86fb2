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
use reverb_core::{Chunk, InsertOutcome, ItemData, Table};
use reverb_proto::{ChunkData, InsertStreamRequest, InsertStreamResponse, PrioritizedItem};
use std::collections::{HashMap, HashSet};
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
    chunks: HashMap<u64, Arc<Chunk>>,
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
        for data in request.chunks {
            self.chunks
                .insert(data.chunk_key, Arc::new(Chunk::new(stored(data))));
        }
        let mut confirmed = Vec::with_capacity(request.items.len());
        for item in request.items {
            let table = tables.get(&item.table)?;
            let priority = item.priority;
            let key = item.key;
            let item = resolve(item, &self.chunks)?;
            insert_waiting(&table, item, priority).await?;
            confirmed.push(key);
        }
        if !request.keep_chunk_keys.is_empty() || !confirmed.is_empty() {
            let keep: HashSet<u64> = request.keep_chunk_keys.into_iter().collect();
            self.chunks.retain(|k, _| keep.contains(k));
        }
        Ok(confirmed)
    }
}

/// A chunk as stored: the shared-memory fields only mean something on the way to one sampling
/// client, so whatever a writer put there is dropped. The payload gets an allocation of its
/// own: as received it is a slice of a larger buffer (the request's, or a compressor's output
/// with spare capacity), all of which it would otherwise keep alive for as long as the chunk
/// is stored.
fn stored(mut data: ChunkData) -> ChunkData {
    data.shm_position = 0;
    data.shm_length = 0;
    data.data = bytes::Bytes::copy_from_slice(&data.data);
    data
}

/// Checks an item's trajectory and attaches the chunks it references.
fn resolve(item: PrioritizedItem, chunks: &HashMap<u64, Arc<Chunk>>) -> Result<ItemData, Status> {
    let trajectory = item.flat_trajectory.as_ref().ok_or_else(|| {
        Status::invalid_argument(format!("Item {} has no flat_trajectory", item.key))
    })?;
    if trajectory.columns.is_empty() {
        return Err(Status::invalid_argument(format!(
            "Item {} has no columns",
            item.key
        )));
    }
    let mut used: Vec<Arc<Chunk>> = Vec::new();
    for (i, column) in trajectory.columns.iter().enumerate() {
        if column.chunk_slices.is_empty() {
            return Err(Status::invalid_argument(format!(
                "Column {i} of item {} has no chunk slices",
                item.key
            )));
        }
        if column.squeeze && (column.chunk_slices.len() != 1 || column.chunk_slices[0].length != 1)
        {
            return Err(Status::invalid_argument(format!(
                "Column {i} of item {} is squeezed but does not reference exactly one row",
                item.key
            )));
        }
        for slice in &column.chunk_slices {
            if slice.offset < 0 || slice.length < 1 || slice.index < 0 {
                return Err(Status::invalid_argument(format!(
                    "Column {i} of item {} has an invalid chunk slice (offset {}, length {}, index {})",
                    item.key, slice.offset, slice.length, slice.index
                )));
            }
            let chunk = chunks.get(&slice.chunk_key).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "Could not find sequence chunk {} referenced by item {}",
                    slice.chunk_key, item.key
                ))
            })?;
            if !used.iter().any(|c| c.key() == slice.chunk_key) {
                used.push(chunk.clone());
            }
        }
    }
    Ok(ItemData::from_proto(item, used))
}

/// Inserts, waiting while the rate limiter blocks.
async fn insert_waiting(table: &Table, mut item: ItemData, priority: f64) -> Result<(), Status> {
    loop {
        let notified = table.changed().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match table.try_insert(item, priority).map_err(from_core)? {
            InsertOutcome::Blocked(back) => item = back,
            _ => return Ok(()),
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_fields_from_writers_are_not_stored() {
        let chunk = stored(ChunkData {
            shm_position: 5,
            shm_length: 10,
            data: vec![1, 2, 3].into(),
            ..Default::default()
        });
        assert_eq!((chunk.shm_position, chunk.shm_length), (0, 0));
        assert_eq!(&chunk.data[..], &[1, 2, 3]);
    }
}
