//! Chunks and items. A chunk is stored exactly as it arrived (its tensor payload stays encoded)
//! and is shared through `Arc` by every item that references it, in any table; it is freed when
//! the last such item is gone.

use reverb_proto::{ChunkData, FlatTrajectory, PrioritizedItem};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Chunks alive in this process, and their payload bytes (see [`Chunk::held`]).
static HELD: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));

/// One column's rows of one episode range, as encoded bytes.
#[derive(Debug)]
pub struct Chunk {
    data: ChunkData,
}

impl Chunk {
    /// Wraps a received chunk.
    pub fn new(data: ChunkData) -> Self {
        HELD.0.fetch_add(1, Ordering::Relaxed);
        HELD.1.fetch_add(data.data.len(), Ordering::Relaxed);
        Self { data }
    }

    /// Chunks alive in this process (held by tables, insert streams or samples in flight)
    /// and the bytes of their payloads.
    pub fn held() -> (usize, usize) {
        (
            HELD.0.load(Ordering::Relaxed),
            HELD.1.load(Ordering::Relaxed),
        )
    }
    /// The chunk's random key.
    pub fn key(&self) -> u64 {
        self.data.chunk_key
    }
    /// The episode the chunk's rows belong to.
    pub fn episode_id(&self) -> u64 {
        self.data
            .sequence_range
            .as_ref()
            .map_or(0, |r| r.episode_id)
    }
    /// The chunk as it goes back on the wire.
    pub fn data(&self) -> &ChunkData {
        &self.data
    }
    /// Bytes of encoded payload (what a sample response carries).
    pub fn byte_size(&self) -> usize {
        self.data.data.len()
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        HELD.0.fetch_sub(1, Ordering::Relaxed);
        HELD.1.fetch_sub(self.data.data.len(), Ordering::Relaxed);
    }
}

/// The immutable part of an item, shared between a table and in-flight samples.
#[derive(Debug)]
pub struct ItemData {
    /// The item's key.
    pub key: u64,
    /// Which table it lives in.
    pub table: String,
    /// The columns as chunk slices.
    pub trajectory: FlatTrajectory,
    /// When the table stored it (set on insertion).
    pub inserted_at: Option<prost_types::Timestamp>,
    /// The chunks the trajectory references, in order of first reference.
    pub chunks: Vec<Arc<Chunk>>,
}

impl ItemData {
    /// Builds an item from its wire form and the chunks it references.
    pub fn from_proto(item: PrioritizedItem, chunks: Vec<Arc<Chunk>>) -> Self {
        Self {
            key: item.key,
            table: item.table,
            trajectory: item.flat_trajectory.unwrap_or_default(),
            inserted_at: item.inserted_at,
            chunks,
        }
    }

    /// The wire form with the given mutable fields.
    pub fn to_proto(&self, priority: f64, times_sampled: i32) -> PrioritizedItem {
        PrioritizedItem {
            key: self.key,
            table: self.table.clone(),
            priority,
            times_sampled,
            inserted_at: self.inserted_at,
            flat_trajectory: Some(self.trajectory.clone()),
            deprecated_chunk_keys: Vec::new(),
            deprecated_sequence_range: None,
        }
    }
}
