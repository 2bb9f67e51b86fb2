//! Chunks and items. A chunk is stored exactly as it arrived (its tensor payload stays encoded)
//! and is shared through `Arc` by every item that references it, in any table; it is freed when
//! the last such item is gone.

use reverb_proto::{ChunkData, FlatTrajectory, PrioritizedItem};
use std::sync::Arc;

/// One column's rows of one episode range, as encoded bytes.
#[derive(Debug)]
pub struct Chunk {
    data: ChunkData,
}

impl Chunk {
    /// Wraps a received chunk.
    pub fn new(data: ChunkData) -> Self {
        Self { data }
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
