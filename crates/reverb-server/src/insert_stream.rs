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
use reverb_core::{Chunk, InsertOutcome, ItemData, RowRef, RunShape, Table, Waiter};
use reverb_proto::payload::{chunk_layouts, Layouts};
use reverb_proto::{
    decode_item, ChunkData, InsertStreamRequest, InsertStreamResponse, ItemRun, KeyHashMap, KeySet,
    PrioritizedItem,
};
use std::collections::VecDeque;
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
        if request.chunks.is_empty() && request.items.is_empty() && request.item_runs.is_empty() {
            return Err(Status::invalid_argument(
                "InsertStreamRequest must contain at least one chunk or item",
            ));
        }
        // Every item is checked before any is inserted: a rejected request inserts nothing
        // (and ends the stream, with the chunks it kept; a disk-backed server wrote the
        // request's chunks as they were checked, and forgets them with the stream).
        let mut received = Vec::with_capacity(request.chunks.len());
        for data in request.chunks {
            received.push(check_chunk(tables, data)?);
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
        let mut runs = Vec::with_capacity(request.item_runs.len());
        for run in &request.item_runs {
            let table = tables.get(&run.table)?;
            let items = resolve_run(&table, run, &self.chunks)?;
            runs.push((table, items, &run.keys));
        }
        let mut confirmed = Vec::with_capacity(resolved.len());
        for (table, item, priority) in resolved {
            let key = item.key;
            insert_waiting(&table, item, priority).await?;
            confirmed.push(key);
        }
        for (table, mut items, keys) in runs {
            insert_many_waiting(&table, &mut items).await?;
            confirmed.extend_from_slice(keys);
        }
        if !confirmed.is_empty() {
            tables.durable().await?;
        }
        if !request.keep_chunk_keys.is_empty() || !confirmed.is_empty() {
            let keep: KeySet = request.keep_chunk_keys.into_iter().collect();
            self.chunks.retain(|k, _| keep.contains(k));
        }
        Ok(confirmed)
    }
}

/// Reads a received chunk's tensor headers (not its data): a chunk no sampler could decode is
/// refused. Then keeps it as the tables do (see [`Tables::keep_chunk`]).
fn check_chunk(tables: &Tables, data: ChunkData) -> Result<Received, Status> {
    let tensors = chunk_layouts(&data).map_err(|e| Status::invalid_argument(e.message))?;
    Ok(Received {
        chunk: tables.keep_chunk(data)?,
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

/// The items of a run, checked against the table (their priorities) and the chunks they
/// reference (every row within its tensor); one list of chunks is shared by all of them.
fn resolve_run(
    table: &Table,
    run: &ItemRun,
    chunks: &KeyHashMap<Received>,
) -> Result<VecDeque<(ItemData, f64)>, Status> {
    let name = &run.table;
    let n = run.keys.len();
    if n == 0 || run.priorities.len() != n {
        return Err(Status::invalid_argument(format!(
            "An item run of table '{name}' needs as many priorities as keys, at least one; \
             it has {n} keys and {} priorities",
            run.priorities.len()
        )));
    }
    if run.columns.is_empty() {
        return Err(Status::invalid_argument(format!(
            "An item run of table '{name}' has no columns"
        )));
    }
    for &priority in &run.priorities {
        table.check_priority(priority).map_err(from_core)?;
    }
    let mut used: Vec<Arc<Chunk>> = Vec::new();
    let mut positions: KeyHashMap<usize> = KeyHashMap::default();
    let mut rows = Vec::with_capacity(run.columns.len());
    for (c, column) in run.columns.iter().enumerate() {
        let key = column.chunk_key;
        let received = chunks.get(&key).ok_or_else(|| {
            Status::invalid_argument(format!(
                "Could not find sequence chunk {key} referenced by column {c} of an item run \
                 of table '{name}'"
            ))
        })?;
        let held = usize::try_from(column.index)
            .ok()
            .and_then(|i| received.tensors.get(i))
            .map_or(0, |t| t.shape().first().copied().unwrap_or(0));
        let end = i64::from(column.offset) + n as i64;
        // (The last item's row must be an i32 too: a tensor without data may claim 2^40 rows.)
        if column.offset < 0
            || end > held
            || end - 1 > i64::from(i32::MAX)
            || received.tensors.len() <= column.index as usize
        {
            return Err(Status::invalid_argument(format!(
                "Column {c} of an item run of table '{name}' references rows {}..{end} of \
                 tensor {} of chunk {key}, which holds {} tensors (that one {held} rows)",
                column.offset,
                column.index,
                received.tensors.len()
            )));
        }
        let position = *positions.entry(key).or_insert_with(|| {
            used.push(received.chunk.clone());
            used.len() - 1
        });
        rows.push(RowRef {
            chunk: position as u32,
            index: column.index,
            row: column.offset,
            squeeze: column.squeeze,
        });
    }
    // The items share their chunk list and their columns (a run's items cost the same
    // whatever its number of columns).
    let used: Arc<[Arc<Chunk>]> = used.into();
    let shape = RunShape::new(&rows);
    let mut items = VecDeque::with_capacity(n);
    for (i, (&key, &priority)) in run.keys.iter().zip(&run.priorities).enumerate() {
        let item = ItemData::of_run(key, used.clone(), &shape, i as i32);
        items.push_back((item, priority));
    }
    Ok(items)
}

/// Inserts `items` in order, each batch of them the rate limiter allows in one hold of the
/// table's lock, waiting while it blocks.
async fn insert_many_waiting(
    table: &Table,
    items: &mut VecDeque<(ItemData, f64)>,
) -> Result<(), Status> {
    table.try_insert_many(items).map_err(from_core)?;
    if items.is_empty() {
        return Ok(());
    }
    let _waiting = table.waiting(Waiter::Insert);
    loop {
        let notified = table.changed().notified();
        tokio::pin!(notified);
        // Registered before trying again, so a change after this attempt wakes the wait.
        notified.as_mut().enable();
        table.try_insert_many(items).map_err(from_core)?;
        if items.is_empty() {
            return Ok(());
        }
        notified.await;
    }
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
