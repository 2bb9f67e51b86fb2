//! Sampled items read where a server of this process holds them (not in the reference): the
//! server hands a client of the same binary each sampled item's record and chunks instead of
//! a message, and the client gathers a batch's columns straight from the chunks' stored
//! bytes. The engine implements [`StoredItem`] for its items; the in-process transport
//! (`inproc`) carries [`HeldSample`]s.

use crate::{ChunkData, PrioritizedItem, SampleInfo};
use std::sync::Arc;

/// One chunk of a stored item, as stored: its payload is a serialized `ChunkTensors`.
#[derive(Debug, Clone, Copy)]
pub struct ChunkView<'a> {
    /// The chunk's key.
    pub key: u64,
    /// The encoded payload.
    pub payload: &'a [u8],
    /// Whether its fixed-size tensors are delta encoded.
    pub delta_encoded: bool,
}

/// One slice of one column of a stored item: `length` rows from row `offset` of tensor
/// `index` of the item's chunk at `chunk` (its position in the item's chunk list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceView {
    /// The column it belongs to.
    pub column: usize,
    /// Whether that column is squeezed.
    pub squeeze: bool,
    /// The chunk's position in the item's chunk list.
    pub chunk: usize,
    /// The tensor's position in the chunk.
    pub index: usize,
    /// First row.
    pub offset: usize,
    /// Rows.
    pub length: usize,
}

/// An item as a server of this process stores it.
pub trait StoredItem: Send + Sync + std::fmt::Debug {
    /// The item's key.
    fn key(&self) -> u64;
    /// How many columns its trajectory has.
    fn columns(&self) -> usize;
    /// How many chunks it references.
    fn chunk_count(&self) -> usize;
    /// The chunk at `position` of its chunk list.
    fn chunk(&self, position: usize) -> ChunkView<'_>;
    /// Prefetches (see [`crate::prefetch`]) what reading it takes at `level` of the walk
    /// from the item to its rows: 0 its own parts (after the record itself), 1 its chunks'
    /// records, 2 their payloads' first lines. Each level reads only what the one before
    /// loaded.
    fn prefetch(&self, level: usize);
    /// Calls `f` with every slice of every column, columns in order, each column's slices
    /// in order (a column without slices has none).
    fn for_each_slice(&self, f: &mut dyn FnMut(SliceView));
    /// The wire form: the item as `table` holds it with these mutable fields, and the
    /// chunks it references (their payloads shared, not copied).
    fn to_wire(
        &self,
        table: &str,
        priority: f64,
        times_sampled: i32,
    ) -> (PrioritizedItem, Vec<ChunkData>);
}

/// One item sampled by a server of this process, held in place, with the values it had
/// when sampled (what `SampleInfo` carries).
#[derive(Debug, Clone)]
pub struct HeldSample {
    /// The item (its chunks stay alive while this is held).
    pub item: Arc<dyn StoredItem>,
    /// The table it was sampled from.
    pub table: Arc<str>,
    /// Priority at sampling time.
    pub priority: f64,
    /// Times sampled, counting this sample.
    pub times_sampled: i32,
    /// Probability the sampler had of picking it.
    pub probability: f64,
    /// Table size when sampled.
    pub table_size: i64,
}

impl HeldSample {
    /// The sample as a sample stream carries it: its info and the chunks it references.
    pub fn to_wire(&self) -> (SampleInfo, Vec<ChunkData>) {
        let (item, chunks) = self
            .item
            .to_wire(&self.table, self.priority, self.times_sampled);
        let info = SampleInfo {
            item: Some(item),
            probability: self.probability,
            table_size: self.table_size,
            rate_limited: false,
        };
        (info, chunks)
    }
}
