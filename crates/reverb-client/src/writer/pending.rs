//! Items created and not yet handed to the insert stream: each waits until every chunk it
//! references is finalized; they leave in creation order.

use super::columns::{ChunkSlot, Columns};
use super::ItemColumn;
use crate::{ClientError, Result};
use bytes::Bytes;
use reverb_proto::flat_trajectory::ChunkSlice;
use reverb_proto::{encode_item, KeyHashMap, KeySet, PrioritizedItem};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::Arc;

/// An item (its key, and its `PrioritizedItem` message encoded) and the chunks it references.
pub(super) type Queued = (u64, Bytes, Vec<Arc<ChunkSlot>>);

/// The queue, with the chunks its items reference (and how many items reference each).
#[derive(Debug, Default)]
pub(super) struct Pending {
    items: VecDeque<Queued>,
    chunks: KeyHashMap<(Arc<ChunkSlot>, usize)>,
}

impl Pending {
    /// Items queued.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Queues an item at the back.
    pub fn push(&mut self, (key, item, slots): Queued) {
        for slot in &slots {
            self.chunks
                .entry(slot.key)
                .or_insert_with(|| (slot.clone(), 0))
                .1 += 1;
        }
        self.items.push_back((key, item, slots));
    }

    /// Whether the front item can leave (every chunk it references is finalized); `None`
    /// when the queue is empty.
    pub fn front_ready(&self) -> Option<bool> {
        let (_, _, slots) = self.items.front()?;
        Some(slots.iter().all(|s| s.finalized()))
    }

    /// The key of the front item.
    pub fn front_key(&self) -> Option<u64> {
        self.items.front().map(|(key, _, _)| *key)
    }

    /// Takes the front item.
    pub fn pop(&mut self) -> Option<Queued> {
        let (key, item, slots) = self.items.pop_front()?;
        for slot in &slots {
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.chunks.entry(slot.key)
            {
                e.get_mut().1 -= 1;
                if e.get().1 == 0 {
                    e.remove();
                }
            }
        }
        Some((key, item, slots))
    }

    /// Keys of the chunks queued items wait for.
    pub fn waiting_for(&self) -> Vec<u64> {
        self.chunks
            .values()
            .filter(|(s, _)| !s.finalized())
            .map(|(s, _)| s.key)
            .collect()
    }

    /// Drops every queued item.
    pub fn clear(&mut self) {
        self.items.clear();
        self.chunks.clear();
    }

    /// Chunk keys the server must keep: finalized chunks of live cells and of queued items.
    pub fn keep_keys(&self, columns: &Columns) -> Vec<u64> {
        let mut seen = KeySet::default();
        let mut keep: Vec<u64> = Vec::new();
        let mut add = |slot: &ChunkSlot| {
            if slot.finalized() && seen.insert(slot.key) {
                keep.push(slot.key);
            }
        };
        for col in columns.iter() {
            let mut last = None;
            for cell in &col.cells {
                if last != Some(cell.slot.key) {
                    add(&cell.slot);
                    last = Some(cell.slot.key);
                }
            }
        }
        for (slot, _) in self.chunks.values() {
            add(slot);
        }
        keep
    }
}

thread_local! {
    /// The message each item is built in before it is encoded, kept (with its strings and
    /// vectors) between items: building a fresh one allocated a string and a vector per
    /// column for every item.
    static MESSAGE: RefCell<PrioritizedItem> = RefCell::default();
}

/// Builds an item of `table` from cells of `columns`, checking every reference; returns it
/// encoded, with the chunks it references. `key` is the item's key.
pub(super) fn build_item(
    key: u64,
    table: &str,
    priority: f64,
    item_columns: &[ItemColumn],
    columns: &Columns,
) -> Result<Queued> {
    if table.is_empty() {
        return Err(ClientError::invalid("table must be a non-empty string"));
    }
    if item_columns.is_empty() {
        return Err(ClientError::invalid(
            "An item must have at least one column",
        ));
    }
    MESSAGE.with_borrow_mut(|item| {
        item.key = key;
        item.table.clear();
        item.table.push_str(table);
        item.priority = priority;
        let flat = &mut item
            .flat_trajectory
            .get_or_insert_with(Default::default)
            .columns;
        flat.truncate(item_columns.len());
        flat.resize_with(item_columns.len(), Default::default);
        let mut slots: Vec<Arc<ChunkSlot>> = Vec::new();
        for (i, (column, out)) in item_columns.iter().zip(flat.iter_mut()).enumerate() {
            if column.refs.is_empty() {
                return Err(ClientError::invalid(format!(
                    "Column {i} of the item has no data references"
                )));
            }
            if column.squeeze && column.refs.len() != 1 {
                return Err(ClientError::invalid(format!(
                    "Column {i} is squeezed but has {} references (must be exactly 1)",
                    column.refs.len()
                )));
            }
            out.squeeze = column.squeeze;
            let slices = &mut out.chunk_slices;
            slices.clear();
            // The first reference's writer column, dtype and row shape: the others must agree
            // (references to the same writer column always do).
            let mut first: Option<(usize, i32, &[i64])> = None;
            for &(c, step) in &column.refs {
                let col = columns.get(c);
                let cell = col.and_then(|col| col.cell(step)).ok_or_else(|| {
                    if col.is_some_and(|col| col.skipped(step)) {
                        return ClientError::invalid(format!(
                            "TrajectoryColumns cannot contain any None data references: column \
                             {i} of the item references step {step} of writer column {c}, which \
                             that step did not set"
                        ));
                    }
                    ClientError::invalid(format!(
                        "Column {i} of the item references step {step} of writer column {c}, \
                         which has expired (increase num_keep_alive_refs) or was never written"
                    ))
                })?;
                let col = col.expect("cell found");
                match first {
                    None => first = Some((c, col.dtype, &col.row_shape)),
                    Some((c0, d, s)) if c0 != c && (d != col.dtype || s != col.row_shape) => {
                        return Err(ClientError::invalid(format!(
                            "Column {i} of the item mixes references of different dtypes or \
                             shapes"
                        )))
                    }
                    _ => {}
                }
                match slices.last_mut() {
                    Some(last)
                        if last.chunk_key == cell.slot.key
                            && last.offset + last.length == cell.offset as i32 =>
                    {
                        last.length += 1
                    }
                    _ => slices.push(ChunkSlice {
                        chunk_key: cell.slot.key,
                        offset: cell.offset as i32,
                        length: 1,
                        index: 0,
                    }),
                }
                if !slots.iter().any(|s| s.key == cell.slot.key) {
                    slots.push(cell.slot.clone());
                }
            }
        }
        Ok((key, encode_item(item), slots))
    })
}
