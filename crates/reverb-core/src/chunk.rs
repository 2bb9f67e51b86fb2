//! Chunks and items. A chunk is stored exactly as it arrived (its tensor payload stays encoded)
//! and is shared through `Arc` by every item that references it, in any table; it is freed when
//! the last such item is gone.

use bytes::Bytes;
use reverb_proto::{flat_trajectory, ChunkData, FlatTrajectory, PrioritizedItem, SequenceRange};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Chunks alive in this process, and their payload bytes (see [`Chunk::held`]).
static HELD: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));

/// One column's rows of one episode range, as encoded bytes. Holds the fields of its
/// `ChunkData` (not the message itself, whose transport-only fields would cost every stored
/// chunk 16 bytes more).
#[derive(Debug)]
pub struct Chunk {
    key: u64,
    range: Option<SequenceRange>,
    payload: Bytes,
    tensors_len: i32,
    uncompressed_size: i64,
    delta_encoded: bool,
}

impl Chunk {
    /// Wraps a received chunk.
    pub fn new(data: ChunkData) -> Self {
        HELD.0.fetch_add(1, Ordering::Relaxed);
        HELD.1.fetch_add(data.data.len(), Ordering::Relaxed);
        Self {
            key: data.chunk_key,
            range: data.sequence_range,
            payload: data.data,
            tensors_len: data.data_tensors_len,
            uncompressed_size: data.data_uncompressed_size,
            delta_encoded: data.delta_encoded,
        }
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
        self.key
    }
    /// The episode the chunk's rows belong to.
    pub fn episode_id(&self) -> u64 {
        self.range.as_ref().map_or(0, |r| r.episode_id)
    }
    /// The chunk as it goes back on the wire (its payload shared, not copied).
    pub fn data(&self) -> ChunkData {
        ChunkData {
            chunk_key: self.key,
            sequence_range: self.range,
            data: self.payload.clone(),
            data_tensors_len: self.tensors_len,
            data_uncompressed_size: self.uncompressed_size,
            delta_encoded: self.delta_encoded,
            ..Default::default()
        }
    }
    /// The encoded payload.
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }
    /// Bytes of encoded payload (what a sample response carries).
    pub fn byte_size(&self) -> usize {
        self.payload.len()
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        HELD.0.fetch_sub(1, Ordering::Relaxed);
        HELD.1.fetch_sub(self.payload.len(), Ordering::Relaxed);
    }
}

/// An item's columns as chunk slices, held in one allocation: the wire form
/// (`FlatTrajectory`) takes one per column and one more, which for the small items of RL
/// replay is a large part of what a stored item costs.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory(Box<[Slice]>);

/// One chunk slice of a column, or the place of a column that has none.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Slice {
    chunk_key: u64,
    offset: i32,
    length: i32,
    index: i32,
    flags: u8,
}

/// The slice starts a column.
const FIRST: u8 = 1;
/// The column it starts is squeezed.
const SQUEEZE: u8 = 2;
/// A column without slices (only its flags mean anything).
const EMPTY: u8 = 4;

impl Trajectory {
    /// The compact form of `trajectory`.
    pub fn from_proto(trajectory: &FlatTrajectory) -> Self {
        let mut slices = Vec::with_capacity(
            trajectory
                .columns
                .iter()
                .map(|c| c.chunk_slices.len().max(1))
                .sum(),
        );
        for column in &trajectory.columns {
            let squeeze = if column.squeeze { SQUEEZE } else { 0 };
            if column.chunk_slices.is_empty() {
                slices.push(Slice {
                    chunk_key: 0,
                    offset: 0,
                    length: 0,
                    index: 0,
                    flags: FIRST | squeeze | EMPTY,
                });
            }
            for (i, s) in column.chunk_slices.iter().enumerate() {
                slices.push(Slice {
                    chunk_key: s.chunk_key,
                    offset: s.offset,
                    length: s.length,
                    index: s.index,
                    flags: if i == 0 { FIRST | squeeze } else { 0 },
                });
            }
        }
        Self(slices.into_boxed_slice())
    }

    /// The wire form.
    pub fn to_proto(&self) -> FlatTrajectory {
        let mut columns: Vec<flat_trajectory::Column> = Vec::new();
        for s in self.0.iter() {
            if s.flags & FIRST != 0 {
                columns.push(flat_trajectory::Column {
                    chunk_slices: Vec::new(),
                    squeeze: s.flags & SQUEEZE != 0,
                });
            }
            if s.flags & EMPTY == 0 {
                let column = columns.last_mut().expect("a slice starts every column");
                column.chunk_slices.push(flat_trajectory::ChunkSlice {
                    chunk_key: s.chunk_key,
                    offset: s.offset,
                    length: s.length,
                    index: s.index,
                });
            }
        }
        FlatTrajectory { columns }
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
    pub trajectory: Trajectory,
    /// When the table stored it (set on insertion).
    pub inserted_at: Option<prost_types::Timestamp>,
    /// The chunks the trajectory references, in order of first reference.
    pub chunks: Vec<Arc<Chunk>>,
}

impl ItemData {
    /// Builds an item from its wire form and the chunks it references.
    pub fn from_proto(item: PrioritizedItem, mut chunks: Vec<Arc<Chunk>>) -> Self {
        chunks.shrink_to_fit();
        Self {
            key: item.key,
            table: item.table,
            trajectory: Trajectory::from_proto(&item.flat_trajectory.unwrap_or_default()),
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
            flat_trajectory: Some(self.trajectory.to_proto()),
            deprecated_chunk_keys: Vec::new(),
            deprecated_sequence_range: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flat_trajectory::{ChunkSlice, Column};

    fn slice(chunk_key: u64, offset: i32, length: i32, index: i32) -> ChunkSlice {
        ChunkSlice {
            chunk_key,
            offset,
            length,
            index,
        }
    }

    #[test]
    fn the_compact_trajectory_gives_back_the_wire_form() {
        let cases = [
            FlatTrajectory::default(),
            FlatTrajectory {
                columns: vec![
                    Column {
                        chunk_slices: vec![slice(7, 1, 2, 0), slice(8, 0, 3, 0)],
                        squeeze: false,
                    },
                    Column {
                        chunk_slices: vec![slice(9, 4, 1, 2)],
                        squeeze: true,
                    },
                    Column {
                        chunk_slices: vec![],
                        squeeze: true,
                    },
                    Column {
                        chunk_slices: vec![],
                        squeeze: false,
                    },
                    Column {
                        chunk_slices: vec![slice(u64::MAX, i32::MAX, -1, i32::MIN)],
                        squeeze: false,
                    },
                ],
            },
        ];
        for case in cases {
            assert_eq!(Trajectory::from_proto(&case).to_proto(), case);
        }
    }
}
