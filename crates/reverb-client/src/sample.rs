//! What a sample is on the client: entries of a sample stream gathered into one sample
//! ([`PartialSample`]), checked and sized with its columns still compressed in their chunks
//! ([`PlannedSample`], [`LazyTensor`]), and decoded ([`Sample`]). Every transport ends here;
//! a server of this process hands its items over in place instead ([`Sampled::Held`]),
//! whose batches are gathered from the chunks as stored (`sampler::batch`); our server
//! answers a sampler that stacks batches with columns ([`Sampled::Row`]).

use crate::tensor::{encode_strings, parse_chunk, Encoded, Tensor, DT_STRING};
use crate::{ClientError, Result};
use reverb_proto::held::HeldSample;
use reverb_proto::payload::dtype_size;
use reverb_proto::{sample_stream_response, ChunkData, KeyHashMap, SampleBatch, SampleInfo};
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

/// One sampled item: its info and one decoded tensor per column.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Key, priority, times sampled, probability, table size.
    pub info: SampleInfo,
    /// Columns, concatenated over their chunk slices (squeezed where flagged).
    pub columns: Vec<Tensor>,
}

/// A sample as samplers hand it out: held in place by a server of this process, or planned
/// from what arrived in a message (gRPC, the C ABI).
#[derive(Debug, Clone)]
pub enum Sampled {
    /// The item as the server holds it (read straight from its chunks).
    Held(HeldSample),
    /// Checked and sized, columns still compressed.
    Planned(PlannedSample),
    /// A row of samples that arrived as columns (asked for by samplers that stack batches:
    /// only a batch takes it, see `sampler::stack`).
    Row(Row),
}

impl Sampled {
    /// The sample planned (a held one through its wire form, checked as a message is). A
    /// row of columns cannot be planned: it is stacked into a batch.
    pub fn plan(self) -> Result<PlannedSample> {
        match self {
            Sampled::Planned(planned) => Ok(planned),
            Sampled::Held(held) => {
                let (info, chunks) = held.to_wire();
                plan(info, &chunks)
            }
            Sampled::Row(_) => Err(ClientError::new(
                tonic::Code::Internal,
                "a sample that arrived as columns can only be stacked into a batch",
            )),
        }
    }

    /// Its probability (of being drawn from the table sampled).
    pub fn probability(&self) -> f64 {
        match self {
            Sampled::Held(held) => held.probability,
            Sampled::Planned(planned) => planned.info.probability,
            Sampled::Row(row) => row.probability,
        }
    }

    /// The size of the table it was sampled from.
    pub fn table_size(&self) -> i64 {
        match self {
            Sampled::Held(held) => held.table_size,
            Sampled::Planned(planned) => planned.info.table_size,
            Sampled::Row(row) => row.table_size,
        }
    }

    /// Sets what [`Sampled::probability`] and [`Sampled::table_size`] say (a sample of one
    /// shard made global).
    pub fn set_drawn(&mut self, probability: f64, table_size: i64) {
        match self {
            Sampled::Held(held) => (held.probability, held.table_size) = (probability, table_size),
            Sampled::Planned(planned) => {
                (planned.info.probability, planned.info.table_size) = (probability, table_size)
            }
            Sampled::Row(row) => (row.probability, row.table_size) = (probability, table_size),
        }
    }
}

/// One sample of a batch that arrived as columns (`SampleBatch`): its row of each (always of
/// a fixed-size dtype).
#[derive(Debug, Clone)]
pub struct Row {
    /// The batch it arrived in.
    pub(crate) batch: Arc<Columns>,
    /// Its row.
    pub(crate) index: usize,
    /// Probability the sampler had of picking it.
    pub(crate) probability: f64,
    /// Table size when sampled.
    pub(crate) table_size: i64,
}

impl Row {
    /// How many columns it has.
    pub fn num_columns(&self) -> usize {
        self.batch.columns.len()
    }

    /// Column `c`'s dtype, shape (this sample's) and bytes (row-major, little-endian).
    pub fn column(&self, c: usize) -> (i32, &[i64], &[u8]) {
        let column = &self.batch.columns[c];
        let at = self.index * column.row_bytes;
        (
            column.dtype,
            &column.row_shape,
            &column.data[at..at + column.row_bytes],
        )
    }

    /// `(key, probability, table_size, priority, times_sampled)`.
    pub fn info(&self) -> (u64, f64, i64, f64, i32) {
        let b = &*self.batch;
        (
            b.keys[self.index],
            self.probability,
            self.table_size,
            b.priorities[self.index],
            b.times_sampled[self.index],
        )
    }
}

/// A batch that arrived as columns, checked: every field has a value per sample and every
/// column a row per sample.
#[derive(Debug)]
pub(crate) struct Columns {
    pub keys: Vec<u64>,
    pub priorities: Vec<f64>,
    pub times_sampled: Vec<i32>,
    pub columns: Vec<RowsOf>,
}

/// One column of a batch that arrived as columns.
#[derive(Debug)]
pub(crate) struct RowsOf {
    pub dtype: i32,
    /// The shape of one row (without the batch dimension).
    pub row_shape: Vec<i64>,
    pub row_bytes: usize,
    pub data: bytes::Bytes,
}

impl Columns {
    /// The rows of `batch` (an error saying what is malformed if it is).
    pub(crate) fn rows(batch: SampleBatch) -> Result<Vec<Sampled>> {
        let n = batch.keys.len();
        let bad = |what: String| {
            ClientError::data_loss(format!("Malformed batch of {n} samples as columns: {what}"))
        };
        for (field, len) in [
            ("probabilities", batch.probabilities.len()),
            ("table sizes", batch.table_sizes.len()),
            ("priorities", batch.priorities.len()),
            ("times sampled", batch.times_sampled.len()),
        ] {
            if len != n {
                return Err(bad(format!("{len} {field}")));
            }
        }
        let mut columns = Vec::with_capacity(batch.columns.len());
        for (c, column) in batch.columns.into_iter().enumerate() {
            let size = dtype_size(column.dtype)
                .ok_or_else(|| bad(format!("column {c} has dtype {}", column.dtype)))?;
            let row_bytes = match column.shape.split_first() {
                // (Its element count must fit an i64, as numpy and TensorFlow count them.)
                Some((&rows, row))
                    if rows == n as i64
                        && row.iter().all(|&d| d >= 0)
                        && row
                            .iter()
                            .try_fold(rows, |p, &d| p.checked_mul(d))
                            .is_some() =>
                {
                    row.iter().try_fold(size, |b, &d| b.checked_mul(d as usize))
                }
                _ => None,
            };
            let row_bytes = row_bytes
                .filter(|&r| r.checked_mul(n) == Some(column.data.len()))
                .ok_or_else(|| {
                    bad(format!(
                        "column {c} of shape {:?} has {} bytes",
                        column.shape,
                        column.data.len()
                    ))
                })?;
            columns.push(RowsOf {
                dtype: column.dtype,
                row_shape: column.shape[1..].to_vec(),
                row_bytes,
                data: column.data,
            });
        }
        let (probabilities, table_sizes) = (batch.probabilities, batch.table_sizes);
        let columns = Arc::new(Columns {
            keys: batch.keys,
            priorities: batch.priorities,
            times_sampled: batch.times_sampled,
            columns,
        });
        Ok((0..n)
            .map(|index| {
                Sampled::Row(Row {
                    batch: columns.clone(),
                    index,
                    probability: probabilities[index],
                    table_size: table_sizes[index],
                })
            })
            .collect())
    }
}

/// Collects a sample's entries from a sample stream: the first carries `info`, the last has
/// `end_of_sequence`, and a sample's chunks may be split over several entries.
#[derive(Default)]
pub(crate) struct PartialSample(Option<(SampleInfo, Vec<ChunkData>)>);

impl PartialSample {
    /// Adds an entry; returns the sample once complete.
    pub(crate) fn add(
        &mut self,
        entry: sample_stream_response::SampleEntry,
    ) -> Result<Option<(SampleInfo, Vec<ChunkData>)>> {
        let (_, chunks) = match (&mut self.0, entry.info) {
            (None, Some(info)) => self.0.insert((info, Vec::new())),
            (Some(p), None) => p,
            _ => {
                return Err(ClientError::data_loss(
                    "Malformed sample stream: sample entries out of order",
                ))
            }
        };
        chunks.extend(entry.data);
        Ok(if entry.end_of_sequence {
            self.0.take()
        } else {
            None
        })
    }

    /// Whether a sample was begun and not completed.
    pub(crate) fn started(&self) -> bool {
        self.0.is_some()
    }
}

/// A sample whose columns are checked and sized but still compressed in their chunks:
/// `LazyTensor::write_to` decompresses a column straight into its destination (a batch,
/// a TensorFlow output), so big rows are copied once on the client instead of twice.
#[derive(Debug, Clone)]
pub struct PlannedSample {
    /// Key, priority, times sampled, probability, table size.
    pub info: SampleInfo,
    /// Columns (squeezed where flagged).
    pub columns: Vec<LazyTensor>,
}

/// A column to be: dtype, shape, and the chunk rows it concatenates.
#[derive(Debug, Clone)]
pub struct LazyTensor {
    /// TensorFlow `DataType` value.
    pub dtype: i32,
    /// Dimensions (without the leading one when squeezed).
    pub shape: Vec<i64>,
    row: usize,
    /// `(chunk tensor, first row, rows)`.
    parts: Vec<(Encoded, usize, usize)>,
}

impl LazyTensor {
    /// Bytes of the column (of a string column: of its elements, not their encoding).
    pub fn byte_len(&self) -> usize {
        self.parts.iter().map(|p| p.2).sum::<usize>() * self.row
    }

    /// Whether this is a string column (whose bytes only [`LazyTensor::to_tensor`] gives).
    pub fn is_string(&self) -> bool {
        self.dtype == DT_STRING
    }

    /// The elements of a string column's rows, from its chunks.
    fn string_tensor(&self) -> Result<Tensor> {
        let mut decoder = snap::raw::Decoder::new();
        let mut wholes = Vec::with_capacity(self.parts.len());
        for (tensor, _, _) in &self.parts {
            wholes.push(tensor.decode(&mut decoder)?);
        }
        let mut elements: Vec<&[u8]> = Vec::new();
        for ((tensor, offset, length), whole) in self.parts.iter().zip(&wholes) {
            let per_row: usize = tensor.shape[1..].iter().map(|&d| d as usize).product();
            let all = whole.strings()?;
            elements.extend_from_slice(&all[offset * per_row..(offset + length) * per_row]);
        }
        Ok(Tensor {
            dtype: DT_STRING,
            shape: self.shape.clone(),
            data: encode_strings(elements.iter().copied()),
        })
    }

    /// Writes the column into `out` (exactly `byte_len()` bytes): rows of chunks stored
    /// uncompressed are copied from them in place, compressed chunks it takes whole are
    /// decompressed in place, others through a decoded copy. Not for string columns.
    pub fn write_to(&self, out: &mut [u8]) -> Result<()> {
        self.write_to_with(out, &mut Decoded::default())
    }

    /// [`LazyTensor::write_to`], decoding each compressed chunk tensor at most once per
    /// `decoded` (a batch's columns share it: items of a batch often share chunks).
    pub fn write_to_with(&self, out: &mut [u8], decoded: &mut Decoded) -> Result<()> {
        if self.is_string() {
            return Err(ClientError::unimplemented(
                "string columns are not written in place (use to_tensor)",
            ));
        }
        if out.len() != self.byte_len() {
            return Err(ClientError::invalid(format!(
                "a column of {} bytes cannot be written into {} bytes",
                self.byte_len(),
                out.len()
            )));
        }
        let mut at = 0;
        for (tensor, offset, length) in &self.parts {
            let dest = &mut out[at..at + length * self.row];
            let rows = offset * self.row..(offset + length) * self.row;
            match Source::of(tensor, *offset, *length) {
                Source::Stored(raw) => dest.copy_from_slice(&raw[rows]),
                Source::Whole => tensor.decompress_into(&mut decoded.decoder, dest)?,
                Source::Decoded => dest.copy_from_slice(&decoded.get(tensor)?.data[rows]),
            }
            at += dest.len();
        }
        Ok(())
    }

    /// The column as a tensor of its own.
    pub fn to_tensor(&self) -> Result<Tensor> {
        if self.is_string() {
            return self.string_tensor();
        }
        let mut data = vec![0u8; self.byte_len()];
        self.write_to(&mut data)?;
        Ok(Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            data,
        })
    }
}

/// Where the rows a column takes of a chunk tensor come from.
enum Source<'a> {
    /// The tensor is stored uncompressed: its rows are read in place.
    Stored(&'a [u8]),
    /// All of a compressed tensor: decompressed in place.
    Whole,
    /// Rows of a compressed (or delta-encoded) tensor: decoded whole first.
    Decoded,
}

impl<'a> Source<'a> {
    fn of(tensor: &'a Encoded, offset: usize, length: usize) -> Self {
        if !tensor.plain() {
            return Source::Decoded; // (delta encoding is undone on the whole tensor)
        }
        match tensor.stored() {
            Some(raw) => Source::Stored(raw),
            None if offset == 0 && length == tensor.rows() => Source::Whole,
            None => Source::Decoded,
        }
    }
}

/// Chunk tensors decoded while writing one column of a batch, kept only while another
/// sample's column still needs them ([`Decoded::expect`] counts the uses first), and the
/// decoder doing it. Without counted uses every tensor is decoded for its one use.
#[derive(Default)]
pub struct Decoded {
    decoder: snap::raw::Decoder,
    /// Uses left of each tensor used more than once: `(chunk key, position in the chunk)`.
    uses: HashMap<(u64, usize), usize>,
    tensors: HashMap<(u64, usize), Tensor>,
}

impl Decoded {
    /// Counts the chunk tensors `columns` will decode whole (only those used twice or more
    /// are kept once decoded). Forgets what an earlier column left.
    pub fn expect<'a>(&mut self, columns: impl IntoIterator<Item = &'a LazyTensor>) {
        self.uses.clear();
        self.tensors.clear();
        for column in columns {
            for (tensor, offset, length) in &column.parts {
                if let Source::Decoded = Source::of(tensor, *offset, *length) {
                    *self
                        .uses
                        .entry((tensor.chunk_key(), tensor.index()))
                        .or_default() += 1;
                }
            }
        }
        self.uses.retain(|_, n| *n > 1);
    }

    /// `tensor` decoded: kept for its next use, handed over at its last.
    fn get(&mut self, tensor: &Encoded) -> Result<Cow<'_, Tensor>> {
        let key = (tensor.chunk_key(), tensor.index());
        let last = match self.uses.get_mut(&key) {
            None => return Ok(Cow::Owned(tensor.decode(&mut self.decoder)?)),
            Some(left) => {
                *left -= 1;
                *left == 0
            }
        };
        if !self.tensors.contains_key(&key) {
            let whole = tensor.decode(&mut self.decoder)?;
            self.tensors.insert(key, whole);
        }
        let whole = &self.tensors[&key];
        // Samples sharing a chunk key must share the chunk (a peer could send otherwise).
        if whole.dtype != tensor.dtype || whole.shape != tensor.shape {
            return Err(ClientError::data_loss(format!(
                "Chunk {} arrived twice in one batch with different tensors ({:?} {:?} and {:?} {:?})",
                key.0, whole.dtype, whole.shape, tensor.dtype, tensor.shape
            )));
        }
        if last {
            self.uses.remove(&key);
            return Ok(Cow::Owned(self.tensors.remove(&key).expect("held")));
        }
        Ok(Cow::Borrowed(&self.tensors[&key]))
    }
}

impl PlannedSample {
    /// Decompresses every column.
    pub fn assemble(self) -> Result<Sample> {
        let columns = self
            .columns
            .iter()
            .map(LazyTensor::to_tensor)
            .collect::<Result<Vec<_>>>()?;
        Ok(Sample {
            info: self.info,
            columns,
        })
    }
}

/// Checks a sample's chunk references and sizes its columns, leaving the data compressed.
/// (Also how the offline checkpoint reader turns a saved item and its chunks into columns.)
pub fn plan(info: SampleInfo, chunks: &[ChunkData]) -> Result<PlannedSample> {
    let mut parsed: KeyHashMap<Vec<Encoded>> =
        KeyHashMap::with_capacity_and_hasher(chunks.len(), Default::default());
    for chunk in chunks {
        if let std::collections::hash_map::Entry::Vacant(slot) = parsed.entry(chunk.chunk_key) {
            slot.insert(parse_chunk(chunk)?);
        }
    }
    let item = info
        .item
        .as_ref()
        .ok_or_else(|| ClientError::data_loss("Sample without an item"))?;
    let trajectory = item
        .flat_trajectory
        .as_ref()
        .ok_or_else(|| ClientError::data_loss("Item without trajectory"))?;
    let mut columns = Vec::with_capacity(trajectory.columns.len());
    for (c, column) in trajectory.columns.iter().enumerate() {
        let mut parts: Vec<(Encoded, usize, usize)> = Vec::with_capacity(column.chunk_slices.len());
        for slice in &column.chunk_slices {
            let tensor = parsed
                .get(&slice.chunk_key)
                .and_then(|ts| ts.get(slice.index as usize))
                .ok_or_else(|| {
                    ClientError::data_loss(format!(
                        "Column {c} references chunk {} (tensor {}) which the sample did not carry",
                        slice.chunk_key, slice.index
                    ))
                })?;
            let (offset, length) = (slice.offset as usize, slice.length as usize);
            if slice.offset < 0
                || slice.length < 0
                || offset + length > tensor.rows()
                || tensor.shape.is_empty()
            {
                return Err(ClientError::data_loss(format!(
                    "Column {c} slices rows {offset}..{} of a chunk with {} rows",
                    offset + length,
                    tensor.rows()
                )));
            }
            if let Some((first, _, _)) = parts.first() {
                if first.dtype != tensor.dtype || first.shape[1..] != tensor.shape[1..] {
                    return Err(ClientError::data_loss(format!(
                        "Column {c} mixes chunks of different dtypes or shapes"
                    )));
                }
            }
            parts.push((tensor.clone(), offset, length));
        }
        let (first, _, _) = parts
            .first()
            .ok_or_else(|| ClientError::data_loss(format!("Column {c} has no slices")))?;
        // Each part is bounded by its chunk's payload; their sum must fit too.
        let rows: usize = parts.iter().map(|p| p.2).sum();
        if rows
            .checked_mul(first.row_bytes())
            .is_none_or(|n| n > isize::MAX as usize)
        {
            return Err(ClientError::data_loss(format!(
                "Column {c} of {rows} rows is too large"
            )));
        }
        let mut shape = first.shape.clone();
        shape[0] = rows as i64;
        if column.squeeze {
            if rows != 1 {
                return Err(ClientError::data_loss(format!(
                    "Column {c} is squeezed but has {rows} rows"
                )));
            }
            shape.remove(0);
        }
        columns.push(LazyTensor {
            dtype: first.dtype,
            shape,
            row: first.row_bytes(),
            parts,
        });
    }
    Ok(PlannedSample { info, columns })
}

#[cfg(test)]
mod tests {
    use super::{plan, Sample};
    use crate::tensor::{encode_chunk_with, Tensor};
    use reverb_proto::flat_trajectory::{ChunkSlice, Column};
    use reverb_proto::{FlatTrajectory, PrioritizedItem, SampleInfo, SequenceRange};

    /// A batch as columns that does not hold what it says is refused as data loss, saying
    /// what is wrong; a good one gives a row per sample.
    #[test]
    fn malformed_batches_of_columns_are_refused() {
        use super::{Columns, Sampled};
        use reverb_proto::{sample_batch, SampleBatch};
        let good = || SampleBatch {
            keys: vec![1, 2],
            probabilities: vec![0.5, 0.5],
            table_sizes: vec![2, 2],
            priorities: vec![1.0, 2.0],
            times_sampled: vec![1, 1],
            columns: vec![sample_batch::Column {
                dtype: 3, // int32
                shape: vec![2, 3],
                data: vec![0u8; 24].into(),
                ..Default::default()
            }],
        };
        let rows = Columns::rows(good()).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(matches!(&rows[1], Sampled::Row(r) if r.info() == (2, 0.5, 2, 2.0, 1)));
        let cases: Vec<(SampleBatch, &str)> = vec![
            (
                SampleBatch {
                    priorities: vec![1.0],
                    ..good()
                },
                "1 priorities",
            ),
            (
                SampleBatch {
                    table_sizes: vec![],
                    ..good()
                },
                "0 table sizes",
            ),
            (
                SampleBatch {
                    columns: vec![sample_batch::Column {
                        dtype: 7,
                        ..good().columns[0].clone()
                    }],
                    ..good()
                },
                "dtype 7",
            ),
            (
                SampleBatch {
                    columns: vec![sample_batch::Column {
                        data: vec![0u8; 23].into(),
                        ..good().columns[0].clone()
                    }],
                    ..good()
                },
                "has 23 bytes",
            ),
            (
                SampleBatch {
                    columns: vec![sample_batch::Column {
                        shape: vec![3, 2],
                        ..good().columns[0].clone()
                    }],
                    ..good()
                },
                "shape [3, 2]",
            ),
            (
                SampleBatch {
                    columns: vec![sample_batch::Column {
                        shape: vec![2, -3],
                        ..good().columns[0].clone()
                    }],
                    ..good()
                },
                "shape [2, -3]",
            ),
            (
                SampleBatch {
                    columns: vec![sample_batch::Column {
                        shape: vec![2, 1 << 62, 1 << 62],
                        ..good().columns[0].clone()
                    }],
                    ..good()
                },
                "has 24 bytes",
            ),
            (
                SampleBatch {
                    columns: vec![sample_batch::Column {
                        dtype: 4, // uint8
                        shape: vec![2, 1 << 62, 3, 0],
                        data: Default::default(),
                        ..Default::default()
                    }],
                    ..good()
                },
                "has 0 bytes",
            ),
        ];
        for (batch, says) in cases {
            let e = Columns::rows(batch).unwrap_err();
            assert_eq!(e.code, tonic::Code::DataLoss);
            assert!(e.message.contains(says), "{} (wanted {says})", e.message);
        }
    }

    fn assemble(info: SampleInfo, chunks: &[reverb_proto::ChunkData]) -> crate::Result<Sample> {
        plan(info, chunks)?.assemble()
    }

    /// A chunk of `rows` rows of 3 int32 values, row r holding `base + r`.
    fn chunk(key: u64, base: i32, rows: usize, delta: bool) -> reverb_proto::ChunkData {
        let data = (0..rows)
            .flat_map(|r| [base + r as i32; 3])
            .flat_map(i32::to_le_bytes)
            .collect();
        let tensor = Tensor::new(3, vec![rows as i64, 3], data).unwrap();
        encode_chunk_with(key, SequenceRange::default(), &[tensor], delta)
    }

    /// A column: `(chunk key, offset, length)` slices, and whether it is squeezed.
    type Spec = (Vec<(u64, i32, i32)>, bool);

    fn info(columns: Vec<Spec>) -> SampleInfo {
        let columns = columns
            .into_iter()
            .map(|(slices, squeeze)| Column {
                chunk_slices: slices
                    .into_iter()
                    .map(|(chunk_key, offset, length)| ChunkSlice {
                        chunk_key,
                        offset,
                        length,
                        index: 0,
                    })
                    .collect(),
                squeeze,
            })
            .collect();
        SampleInfo {
            item: Some(PrioritizedItem {
                flat_trajectory: Some(FlatTrajectory { columns }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn rows(t: &Tensor) -> Vec<i32> {
        t.data
            .chunks_exact(12)
            .map(|r| i32::from_le_bytes(r[..4].try_into().unwrap()))
            .collect()
    }

    #[test]
    fn columns_join_whole_partial_and_delta_encoded_chunks() {
        let chunks = [
            chunk(1, 0, 3, false),
            chunk(2, 10, 2, false),
            chunk(3, 20, 3, true),
        ];
        let sample = assemble(
            info(vec![
                // Part of 1, all of 2, part of the delta-encoded 3, then all of 3.
                (vec![(1, 1, 2), (2, 0, 2), (3, 1, 1), (3, 0, 3)], false),
                (vec![(2, 1, 1)], true),
            ]),
            &chunks,
        )
        .unwrap();
        let (a, b) = (&sample.columns[0], &sample.columns[1]);
        assert_eq!(a.shape, vec![8, 3]);
        assert_eq!(rows(a), vec![1, 2, 10, 11, 21, 20, 21, 22]);
        assert_eq!(b.shape, vec![3]);
        assert_eq!(
            b.data,
            [11i32; 3]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>()
        );
    }

    /// A chunk whose single uint8 tensor claims `shape` but holds `payload` bytes.
    fn lying_chunk(key: u64, shape: &[i64], payload: usize) -> reverb_proto::ChunkData {
        use prost::Message;
        use reverb_proto::tensorflow::{TensorProto, TensorShapeProto};
        let content = snap::raw::Encoder::new()
            .compress_vec(&vec![7u8; payload])
            .unwrap();
        let tensor = TensorProto {
            dtype: 4,
            tensor_shape: Some(TensorShapeProto::of(shape)),
            tensor_content: content.into(),
            ..Default::default()
        };
        reverb_proto::ChunkData {
            chunk_key: key,
            data: reverb_proto::ChunkTensors {
                tensors: vec![tensor],
            }
            .encode_to_vec()
            .into(),
            data_tensors_len: 1,
            ..Default::default()
        }
    }

    #[test]
    fn sizes_a_server_claims_are_checked_before_allocating() {
        for (shape, what) in [
            (
                vec![1 << 20, 1 << 20],
                "needs 1099511627776 bytes but its payload holds 1",
            ),
            (vec![0, 1 << 40, 1 << 40], "is too large"),
            (vec![2, 3], "needs 6 bytes but its payload holds 1"),
        ] {
            let chunks = [lying_chunk(1, &shape, 1)];
            let e = assemble(info(vec![(vec![(1, 0, 1)], false)]), &chunks).unwrap_err();
            assert!(e.message.contains(what), "{shape:?}: {}", e.message);
        }
        let chunks = [lying_chunk(1, &[2, 3], 6)];
        let sample = assemble(info(vec![(vec![(1, 1, 1)], false)]), &chunks).unwrap();
        assert_eq!(sample.columns[0].data, vec![7u8; 3]);
    }

    #[test]
    fn string_columns_join_slices_of_their_chunks() {
        use crate::tensor::{decode_strings, encode_strings, DT_STRING};
        let strings = |key: u64, words: &[&str]| {
            let t = Tensor::new(
                DT_STRING,
                vec![words.len() as i64 / 2, 2],
                encode_strings(words.iter().map(|w| w.as_bytes())),
            )
            .unwrap();
            encode_chunk_with(key, SequenceRange::default(), &[t], false)
        };
        let chunks = [
            strings(1, &["a0", "a1", "b0", "b1", "c0", "c1"]),
            strings(2, &["d0", "", "e0", "e1"]),
        ];
        let sample = assemble(
            info(vec![
                (vec![(1, 1, 2), (2, 0, 1)], false),
                (vec![(2, 1, 1)], true),
            ]),
            &chunks,
        )
        .unwrap();
        let (a, b) = (&sample.columns[0], &sample.columns[1]);
        assert_eq!(a.shape, vec![3, 2]);
        let words: Vec<&[u8]> = decode_strings(&a.data, 6).unwrap();
        assert_eq!(words, [&b"b0"[..], b"b1", b"c0", b"c1", b"d0", b""]);
        assert_eq!(b.shape, vec![2]);
        assert_eq!(decode_strings(&b.data, 2).unwrap(), [&b"e0"[..], b"e1"]);
    }

    #[test]
    fn bad_references_are_data_loss_errors() {
        let chunks = [chunk(1, 0, 3, false)];
        for (columns, what) in [
            (vec![(vec![(9, 0, 1)], false)], "did not carry"),
            (vec![(vec![(1, 2, 2)], false)], "slices rows 2..4"),
            (vec![(vec![(1, 0, 2)], true)], "squeezed but has 2 rows"),
            (vec![(vec![], false)], "no slices"),
        ] {
            let e = assemble(info(columns), &chunks).unwrap_err();
            assert!(e.message.contains(what), "{} lacks {what}", e.message);
        }
    }

    /// Samples of one batch taking rows of shared compressed chunks: the batch holds each
    /// sample's own rows (each chunk decoded once per column); a peer sending one chunk key
    /// with two shapes in a batch gets an error, not a panic.
    #[test]
    fn batches_decode_shared_compressed_chunks_once_and_check_them() {
        let shared = chunk(7, 100, 64, false);
        let other = chunk(8, 500, 64, true);
        assert!(crate::tensor::parse_chunk(&shared).unwrap()[0]
            .stored()
            .is_none());
        let chunks = [shared, other];
        let samples: Vec<_> = (0..6)
            .map(|i| plan(info(vec![(vec![(7, i, 3), (8, 2 * i, 2)], false)]), &chunks).unwrap())
            .collect();
        let one_by_one: Vec<Tensor> = samples
            .iter()
            .map(|s| s.clone().assemble().unwrap().columns.remove(0))
            .collect();
        let batch = crate::sampler::stack_planned(samples.clone()).unwrap();
        assert_eq!(batch.columns[0].shape, vec![6, 5, 3]);
        let expected: Vec<u8> = one_by_one.iter().flat_map(|t| t.data.clone()).collect();
        assert_eq!(batch.columns[0].data, expected);
        assert_eq!(rows(&one_by_one[2]), vec![102, 103, 104, 504, 505]);

        let liar = [chunk(7, 0, 32, false)];
        let mut mixed = samples;
        mixed.push(plan(info(vec![(vec![(7, 0, 5)], false)]), &liar).unwrap());
        let e = crate::sampler::stack_planned(mixed).unwrap_err();
        assert!(e.message.contains("arrived twice"), "{}", e.message);
    }
}
