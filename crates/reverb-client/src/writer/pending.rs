//! Items created and not yet handed to the insert stream: each waits until every chunk it
//! references is finalized; they leave in creation order.

use super::columns::{ChunkSlot, Columns};
use super::ItemColumn;
use crate::{ClientError, Result};
use reverb_proto::flat_trajectory::{ChunkSlice, Column as FlatColumn};
use reverb_proto::{FlatTrajectory, KeyHashMap, KeySet, PrioritizedItem};
use std::collections::VecDeque;
use std::sync::Arc;

/// An item and the chunks it references.
pub(super) type Queued = (PrioritizedItem, Vec<Arc<ChunkSlot>>);

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
    pub fn push(&mut self, item: PrioritizedItem, slots: Vec<Arc<ChunkSlot>>) {
        for slot in &slots {
            self.chunks
                .entry(slot.key)
                .or_insert_with(|| (slot.clone(), 0))
                .1 += 1;
        }
        self.items.push_back((item, slots));
    }

    /// Whether the front item can leave (every chunk it references is finalized); `None`
    /// when the queue is empty.
    pub fn front_ready(&self) -> Option<bool> {
        let (_, slots) = self.items.front()?;
        Some(slots.iter().all(|s| s.finalized()))
    }

    /// Takes the front item.
    pub fn pop(&mut self) -> Option<Queued> {
        let (item, slots) = self.items.pop_front()?;
        for slot in &slots {
            if let std::collections::hash_map::Entry::Occupied(mut e) = self.chunks.entry(slot.key)
            {
                e.get_mut().1 -= 1;
                if e.get().1 == 0 {
                    e.remove();
                }
            }
        }
        Some((item, slots))
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

/// Builds an item of `table` from cells of `columns`, checking every reference; returns it
/// with the chunks it references. `key` is the item's key.
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
    let mut flat = Vec::with_capacity(item_columns.len());
    let mut slots: Vec<Arc<ChunkSlot>> = Vec::new();
    for (i, column) in item_columns.iter().enumerate() {
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
        // The first reference's writer column, dtype and row shape: the others must agree
        // (references to the same writer column always do).
        let mut first: Option<(usize, i32, &[i64])> = None;
        let mut slices: Vec<ChunkSlice> = Vec::new();
        for &(c, step) in &column.refs {
            let col = columns.get(c);
            let cell = col.and_then(|col| col.cell(step)).ok_or_else(|| {
                ClientError::invalid(format!(
                    "Column {i} of the item references step {step} of writer column {c}, which has \
                     expired (increase num_keep_alive_refs) or was never written"
                ))
            })?;
            let col = col.expect("cell found");
            match first {
                None => first = Some((c, col.dtype, &col.row_shape)),
                Some((c0, d, s)) if c0 != c && (d != col.dtype || s != col.row_shape) => {
                    return Err(ClientError::invalid(format!(
                        "Column {i} of the item mixes references of different dtypes or shapes"
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
        flat.push(FlatColumn {
            chunk_slices: slices,
            squeeze: column.squeeze,
        });
    }
    let item = PrioritizedItem {
        key,
        table: table.to_string(),
        priority,
        flat_trajectory: Some(FlatTrajectory { columns: flat }),
        ..Default::default()
    };
    Ok((item, slots))
}
