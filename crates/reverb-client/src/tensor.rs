//! Tensors as chunks carry them: TensorProto with snappy-compressed `tensor_content` (raw
//! block format), optionally delta-encoded along the time axis for integer types.

use crate::{ClientError, Result};
use bytes::Bytes;
use prost::Message;
use reverb_proto::tensorflow::{DataType, TensorProto, TensorShapeProto};
use reverb_proto::{ChunkData, SequenceRange};

pub(crate) use reverb_proto::payload::stored_bytes;
pub use reverb_proto::payload::{dtype_name, dtype_size, encode_strings, DTYPES, DT_STRING};
use reverb_proto::payload::{elements_of, read_chunk};

/// A dense tensor: dtype, shape and its bytes in row-major, native (little-endian) order.
/// A string tensor's bytes are TensorFlow's string-list encoding ([`encode_strings`]), as
/// chunks carry them.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// TensorFlow `DataType` value.
    pub dtype: i32,
    /// Dimensions.
    pub shape: Vec<i64>,
    /// Row-major element bytes.
    pub data: Vec<u8>,
}

/// The `n` elements of a string list ([`encode_strings`]); an error when it does not hold
/// exactly `n` elements.
pub fn decode_strings(data: &[u8], n: usize) -> Result<Vec<&[u8]>> {
    reverb_proto::payload::decode_strings(data, n).map_err(ClientError::data_loss)
}

impl Tensor {
    /// Checks that the bytes match dtype and shape.
    pub fn new(dtype: i32, shape: Vec<i64>, data: Vec<u8>) -> Result<Self> {
        if dtype == DT_STRING {
            let n = elements_of(&shape)
                .ok_or_else(|| ClientError::invalid(format!("Bad shape {shape:?}")))?;
            decode_strings(&data, n).map_err(|e| ClientError::invalid(e.message))?;
            return Ok(Self { dtype, shape, data });
        }
        let size = dtype_size(dtype)
            .ok_or_else(|| ClientError::invalid(format!("Unsupported tensor dtype {dtype}")))?;
        if shape.iter().any(|&d| d < 0) {
            return Err(ClientError::invalid(format!(
                "Negative dimension in shape {shape:?}"
            )));
        }
        let expected = shape.iter().product::<i64>() as usize * size;
        if expected != data.len() {
            return Err(ClientError::invalid(format!(
                "Tensor of shape {shape:?} needs {expected} bytes, got {}",
                data.len()
            )));
        }
        Ok(Self { dtype, shape, data })
    }

    /// Bytes of one row (everything but the leading dimension).
    pub fn row_bytes(&self) -> usize {
        self.shape.iter().skip(1).product::<i64>() as usize * dtype_size(self.dtype).unwrap_or(0)
    }

    /// Number of rows (leading dimension).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1) as usize
    }

    /// The elements of a string tensor (its shape says how many).
    pub fn strings(&self) -> Result<Vec<&[u8]>> {
        let n = elements_of(&self.shape)
            .ok_or_else(|| ClientError::data_loss(format!("Bad shape {:?}", self.shape)))?;
        decode_strings(&self.data, n)
    }
}

/// A tensor's dtype, shape and bytes, borrowed: what the writers copy appended values from
/// (an owned [`Tensor`], or an array of the caller's, without an extra copy).
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// TensorFlow `DataType` value.
    pub dtype: i32,
    /// Dimensions.
    pub shape: &'a [i64],
    /// Row-major element bytes.
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// Bytes of one row (everything but the leading dimension).
    pub fn row_bytes(&self) -> usize {
        self.shape.iter().skip(1).product::<i64>() as usize * dtype_size(self.dtype).unwrap_or(0)
    }
}

/// Values the writers take: owned tensors or borrowed views.
pub trait AsView {
    /// The value as a view.
    fn view(&self) -> TensorView<'_>;
}

impl AsView for Tensor {
    fn view(&self) -> TensorView<'_> {
        TensorView {
            dtype: self.dtype,
            shape: &self.shape,
            data: &self.data,
        }
    }
}

impl AsView for TensorView<'_> {
    fn view(&self) -> TensorView<'_> {
        *self
    }
}

/// Encodes tensors (each `[rows, ...]`) as one chunk.
pub fn encode_chunk(chunk_key: u64, range: SequenceRange, tensors: &[Tensor]) -> ChunkData {
    encode_chunk_with(chunk_key, range, tensors, false)
}

/// Like [`encode_chunk`]; with `delta`, integer tensors of rank >= 2 are stored as
/// differences between consecutive rows (`out[i] = in[i] - in[i-1]`, wrapping), which
/// compresses slowly-changing integer data (counters, frames) much better.
pub fn encode_chunk_with(
    chunk_key: u64,
    range: SequenceRange,
    tensors: &[Tensor],
    delta: bool,
) -> ChunkData {
    thread_local! {
        // Reused: a fresh encoder allocates and clears its hash table on every call, and
        // compressing into a fresh buffer would allocate and clear that every chunk.
        static COMPRESSOR: std::cell::RefCell<(snap::raw::Encoder, Vec<u8>)> =
            std::cell::RefCell::new((snap::raw::Encoder::new(), Vec::new()));
    }
    COMPRESSOR.with_borrow_mut(|(encoder, scratch)| {
        encode_chunk_using(encoder, scratch, chunk_key, range, tensors, delta)
    })
}

/// The most compression buffer a thread keeps between chunks.
const KEPT_SCRATCH: usize = 4 << 20;

fn encode_chunk_using(
    encoder: &mut snap::raw::Encoder,
    scratch: &mut Vec<u8>,
    chunk_key: u64,
    range: SequenceRange,
    tensors: &[Tensor],
    delta: bool,
) -> ChunkData {
    let mut uncompressed = 0i64;
    let mut out = Vec::new();
    for t in tensors {
        uncompressed += t.data.len() as i64;
        let content: &[u8] = if t.dtype == DT_STRING {
            // As the reference stores them: uncompressed, never delta-encoded.
            &t.data
        } else {
            let mut encoded;
            let raw = if delta {
                encoded = t.clone();
                delta_encode(&mut encoded);
                &encoded.data
            } else {
                &t.data
            };
            let max = snap::raw::max_compress_len(raw.len());
            if scratch.len() < max {
                scratch.resize(max, 0);
            }
            let n = encoder.compress(raw, scratch).expect("snappy compress");
            if pays(n, raw.len()) {
                &scratch[..n]
            } else {
                let n = stored(raw, scratch);
                &scratch[..n]
            }
        };
        write_tensor(&mut out, t, content);
    }
    // (One big chunk, e.g. a whole trajectory `Client.insert` sends, is not kept for.)
    if scratch.len() > KEPT_SCRATCH {
        *scratch = Vec::new();
    }
    ChunkData {
        chunk_key,
        sequence_range: Some(range),
        data: Bytes::from(out),
        data_tensors_len: tensors.len() as i32,
        data_uncompressed_size: uncompressed,
        delta_encoded: delta,
        ..Default::default()
    }
}

/// Whether compressing `raw` bytes to `compressed` bytes pays for decompressing them on
/// every read: it must save at least an eighth. (Random floats, already-compressed images
/// and most small rows do not; they are stored as they are, see [`stored`].)
fn pays(compressed: usize, raw: usize) -> bool {
    compressed <= raw - raw / 8
}

/// Writes `raw` into `out` as snappy data holding it uncompressed (the length, then one
/// literal), which every snappy reader (the reference's too) decompresses, and ours reads in
/// place ([`Encoded::stored`]). Returns the bytes written. `out` must hold
/// `snap::raw::max_compress_len(raw.len())` bytes (it holds 10 more than needed).
fn stored(raw: &[u8], out: &mut [u8]) -> usize {
    // (Snappy, and so its compression before this, takes at most 4 GiB.)
    debug_assert!(raw.len() <= u32::MAX as usize);
    let mut at = 0;
    let mut put = |b: u8| {
        out[at] = b;
        at += 1;
    };
    // The uncompressed length, a varint.
    let mut n = raw.len() as u64;
    while n >= 0x80 {
        put(n as u8 | 0x80);
        n >>= 7;
    }
    put(n as u8);
    if !raw.is_empty() {
        // A literal tag: (len - 1) in the tag for short ones, else in 1 to 4 bytes after it.
        let len = raw.len() as u64 - 1;
        if len < 60 {
            put((len as u8) << 2);
        } else {
            let bytes = (64 - len.leading_zeros()).div_ceil(8) as u8;
            put((59 + bytes) << 2);
            for i in 0..bytes {
                put((len >> (8 * i)) as u8);
            }
        }
    }
    out[at..at + raw.len()].copy_from_slice(raw);
    at + raw.len()
}

/// Appends to `out` a `ChunkTensors.tensors` entry: `t`'s dtype and shape, with `content` as
/// its `tensor_content`. The bytes prost gives the same message (fields in number order),
/// without first copying `content` into a message of its own.
fn write_tensor(out: &mut Vec<u8>, t: &Tensor, content: &[u8]) {
    use prost::encoding::{encode_key, encode_varint, encoded_len_varint, WireType};
    let header = TensorProto {
        dtype: t.dtype,
        tensor_shape: Some(TensorShapeProto::of(&t.shape)),
        ..Default::default()
    };
    // (prost leaves an empty `bytes` field out.)
    let content_len = if content.is_empty() {
        0
    } else {
        1 + encoded_len_varint(content.len() as u64) + content.len()
    };
    let len = header.encoded_len() + content_len;
    out.reserve(1 + encoded_len_varint(len as u64) + len);
    encode_key(1, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
    header.encode_raw(out);
    if !content.is_empty() {
        encode_key(4, WireType::LengthDelimited, out);
        encode_varint(content.len() as u64, out);
        out.extend_from_slice(content);
    }
}

/// A tensor of a chunk before decompression: its header, and its compressed bytes (shared
/// with the chunk, not copied).
#[derive(Debug, Clone)]
pub(crate) struct Encoded {
    pub dtype: i32,
    pub shape: Vec<i64>,
    content: Bytes,
    /// Bytes once decompressed.
    pub len: usize,
    delta: bool,
    chunk_key: u64,
    index: usize,
}

impl Encoded {
    /// Number of rows (leading dimension).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1) as usize
    }

    /// Bytes of one row (`parse_chunk` checked that the whole tensor's size fits).
    pub fn row_bytes(&self) -> usize {
        self.shape
            .iter()
            .skip(1)
            .fold(dtype_size(self.dtype).unwrap_or(0), |n, &d| {
                n.saturating_mul(d as usize)
            })
    }

    /// Key of the chunk holding the tensor.
    pub fn chunk_key(&self) -> u64 {
        self.chunk_key
    }

    /// Its position in the chunk.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether `decompress_into` can be used (no delta encoding to undo).
    pub fn plain(&self) -> bool {
        !self.delta || self.dtype == DT_STRING
    }

    /// The tensor's bytes (delta encoding not undone) when it is stored uncompressed (strings
    /// always are; others when compression did not pay): read in place, shared with the
    /// chunk.
    pub fn stored(&self) -> Option<&[u8]> {
        if self.dtype == DT_STRING {
            return Some(&self.content);
        }
        stored_bytes(&self.content, self.len)
    }

    /// Decompresses into `out` (exactly `len` bytes) without undoing delta encoding.
    pub fn decompress_into(&self, decoder: &mut snap::raw::Decoder, out: &mut [u8]) -> Result<()> {
        if self.len == 0 && self.content.is_empty() {
            return Ok(());
        }
        // Strings, and tensors whose compression did not pay, are stored as they are.
        if let Some(raw) = self.stored() {
            if out.len() != raw.len() {
                return Err(ClientError::invalid(format!(
                    "a tensor of {} bytes cannot be written into {} bytes",
                    raw.len(),
                    out.len()
                )));
            }
            out.copy_from_slice(raw);
            return Ok(());
        }
        let corrupt = |what: String| {
            ClientError::data_loss(format!(
                "Chunk {} could not be decompressed: {what}",
                self.chunk_key
            ))
        };
        match snap::raw::decompress_len(&self.content) {
            Ok(n) if n == self.len && out.len() == n => {}
            Ok(n) => {
                return Err(corrupt(format!(
                    "{n} bytes for a tensor of shape {:?} ({} bytes)",
                    self.shape, self.len
                )))
            }
            Err(e) => return Err(corrupt(e.to_string())),
        }
        decoder
            .decompress(&self.content, out)
            .map_err(|e| corrupt(e.to_string()))?;
        Ok(())
    }

    /// The whole tensor, decompressed and delta-decoded.
    pub fn decode(&self, decoder: &mut snap::raw::Decoder) -> Result<Tensor> {
        let mut data = vec![0u8; self.len];
        self.decompress_into(decoder, &mut data)?;
        let mut tensor = Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            data,
        };
        if self.delta && self.dtype != DT_STRING {
            delta_decode(&mut tensor);
        }
        Ok(tensor)
    }
}

/// Reads a chunk's tensor headers; their bytes stay compressed (and shared with the chunk).
pub(crate) fn parse_chunk(chunk: &ChunkData) -> Result<Vec<Encoded>> {
    let tensors = read_chunk(chunk).map_err(|e| {
        if e.unsupported {
            ClientError::unimplemented(e.message)
        } else {
            ClientError::data_loss(e.message)
        }
    })?;
    Ok(tensors
        .into_iter()
        .enumerate()
        .map(|(index, t)| Encoded {
            dtype: t.dtype,
            shape: t.shape,
            content: t.content,
            len: t.len,
            delta: chunk.delta_encoded && t.dtype != DT_STRING,
            chunk_key: chunk.chunk_key,
            index,
        })
        .collect())
}

/// Decodes every tensor of a chunk (decompressing and undoing delta encoding).
pub fn decode_chunk(chunk: &ChunkData) -> Result<Vec<Tensor>> {
    let mut decoder = snap::raw::Decoder::new();
    parse_chunk(chunk)?
        .iter()
        .map(|t| t.decode(&mut decoder))
        .collect()
}

macro_rules! cumsum_rows {
    ($t:ty, $tensor:expr) => {{
        let row = $tensor.row_bytes() / std::mem::size_of::<$t>();
        let mut values: Vec<$t> = $tensor
            .data
            .chunks_exact(std::mem::size_of::<$t>())
            .map(|b| <$t>::from_le_bytes(b.try_into().unwrap()))
            .collect();
        for i in row..values.len() {
            values[i] = values[i].wrapping_add(values[i - row]);
        }
        $tensor.data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    }};
}

macro_rules! diff_rows {
    ($t:ty, $tensor:expr) => {{
        let row = $tensor.row_bytes() / std::mem::size_of::<$t>();
        let mut values: Vec<$t> = $tensor
            .data
            .chunks_exact(std::mem::size_of::<$t>())
            .map(|b| <$t>::from_le_bytes(b.try_into().unwrap()))
            .collect();
        for i in (row..values.len()).rev() {
            values[i] = values[i].wrapping_sub(values[i - row]);
        }
        $tensor.data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    }};
}

/// Applies `$op` (a row macro) to integer tensors of rank >= 2; others are left as they are.
macro_rules! for_integer_tensor {
    ($op:ident, $tensor:expr) => {{
        if $tensor.shape.len() >= 2 {
            use DataType::*;
            match DataType::try_from($tensor.dtype) {
                Ok(DtInt8) => $op!(i8, $tensor),
                Ok(DtUint8) => $op!(u8, $tensor),
                Ok(DtInt16) => $op!(i16, $tensor),
                Ok(DtUint16) => $op!(u16, $tensor),
                Ok(DtInt32) => $op!(i32, $tensor),
                Ok(DtUint32) => $op!(u32, $tensor),
                Ok(DtInt64) => $op!(i64, $tensor),
                Ok(DtUint64) => $op!(u64, $tensor),
                _ => {}
            }
        }
    }};
}

/// `out[i] = in[i] - in[i-1]` along the leading axis (integer tensors of rank >= 2).
fn delta_encode(tensor: &mut Tensor) {
    for_integer_tensor!(diff_rows, tensor);
}

/// Undoes [`delta_encode`].
fn delta_decode(tensor: &mut Tensor) {
    for_integer_tensor!(cumsum_rows, tensor);
}

#[cfg(test)]
mod tests {
    use super::*;
    use reverb_proto::ChunkTensors;

    #[test]
    fn chunk_round_trip() {
        let a = Tensor::new(DataType::DtFloat as i32, vec![2, 3], (0..24).collect()).unwrap();
        let b = Tensor::new(DataType::DtInt64 as i32, vec![2], vec![7; 16]).unwrap();
        let chunk = encode_chunk(
            5,
            SequenceRange {
                episode_id: 1,
                start: 0,
                end: 1,
                sparse: false,
            },
            &[a.clone(), b.clone()],
        );
        assert_eq!(chunk.data_tensors_len, 2);
        assert_eq!(decode_chunk(&chunk).unwrap(), vec![a, b]);
    }

    proptest::proptest! {
        /// A chunk's payload is the bytes prost gives its `ChunkTensors` message, tensors
        /// compressed where it pays, else stored (strings left as they are, integers
        /// delta-encoded when asked).
        #[test]
        fn chunks_encode_as_prost_does(
            columns in proptest::collection::vec(
                (0usize..4, 0i64..5, 0i64..40, proptest::num::u8::ANY), 1..4),
            delta in proptest::bool::ANY,
        ) {
            let tensors: Vec<Tensor> = columns
                .iter()
                .map(|&(kind, rows, width, fill)| {
                    let (dtype, size) = [(1, 4), (3, 4), (9, 8), (DT_STRING, 0)][kind];
                    if dtype == DT_STRING {
                        let elements: Vec<Vec<u8>> =
                            (0..rows).map(|r| vec![fill; (r * width) as usize % 17]).collect();
                        let data = encode_strings(elements.iter().map(Vec::as_slice));
                        return Tensor::new(dtype, vec![rows], data).unwrap();
                    }
                    let data = (0..rows * width * size).map(|i| (i as u8 / 3) ^ fill).collect();
                    Tensor::new(dtype, vec![rows, width], data).unwrap()
                })
                .collect();
            let range = SequenceRange { episode_id: 3, start: 0, end: 4, sparse: false };
            let chunk = encode_chunk_with(9, range, &tensors, delta);
            let protos = tensors
                .iter()
                .map(|t| {
                    let content = if t.dtype == DT_STRING {
                        t.data.clone()
                    } else {
                        let mut t = t.clone();
                        if delta {
                            delta_encode(&mut t);
                        }
                        let compressed = snap::raw::Encoder::new().compress_vec(&t.data).unwrap();
                        if pays(compressed.len(), t.data.len()) {
                            compressed
                        } else {
                            let mut out = vec![0; snap::raw::max_compress_len(t.data.len())];
                            let n = stored(&t.data, &mut out);
                            out.truncate(n);
                            out
                        }
                    };
                    TensorProto {
                        dtype: t.dtype,
                        tensor_shape: Some(TensorShapeProto::of(&t.shape)),
                        tensor_content: Bytes::from(content),
                        ..Default::default()
                    }
                })
                .collect();
            let expected = ChunkTensors { tensors: protos }.encode_to_vec();
            proptest::prop_assert_eq!(&chunk.data[..], &expected[..]);
            proptest::prop_assert_eq!(decode_chunk(&chunk).unwrap(), tensors);
        }

        #[test]
        fn string_lists_round_trip(elements in proptest::collection::vec(
            proptest::collection::vec(proptest::num::u8::ANY, 0..300), 0..20)) {
            let encoded = encode_strings(elements.iter().map(Vec::as_slice));
            let decoded = decode_strings(&encoded, elements.len()).unwrap();
            proptest::prop_assert_eq!(decoded, elements.iter().map(Vec::as_slice).collect::<Vec<_>>());
            // Any other count, and any truncation, is refused.
            proptest::prop_assert!(decode_strings(&encoded, elements.len() + 1).is_err());
            if !encoded.is_empty() {
                proptest::prop_assert!(decode_strings(&encoded[..encoded.len() - 1], elements.len()).is_err());
            }
        }
    }

    #[test]
    fn string_tensors_travel_uncompressed_and_from_string_val() {
        let elements: [&[u8]; 4] = [b"a", b"", b"longer \xff bytes", b"d"];
        let t = Tensor::new(DT_STRING, vec![2, 2], encode_strings(elements)).unwrap();
        for delta in [false, true] {
            let chunk =
                encode_chunk_with(9, SequenceRange::default(), std::slice::from_ref(&t), delta);
            let proto = ChunkTensors::decode(chunk.data.clone())
                .unwrap()
                .tensors
                .remove(0);
            // As the reference stores them: TensorFlow's string-list encoding, uncompressed.
            assert_eq!(proto.dtype, DT_STRING);
            assert_eq!(&proto.tensor_content[..], &t.data[..]);
            assert_eq!(decode_chunk(&chunk).unwrap(), vec![t.clone()]);
        }
        // A TensorProto holding string_val (as TensorFlow's Python makes them) decodes too.
        let proto = TensorProto {
            dtype: DT_STRING,
            tensor_shape: Some(TensorShapeProto::of(&[2, 2])),
            string_val: elements.iter().map(|e| Bytes::copy_from_slice(e)).collect(),
            ..Default::default()
        };
        let chunk = ChunkData {
            chunk_key: 3,
            data: Bytes::from(
                ChunkTensors {
                    tensors: vec![proto],
                }
                .encode_to_vec(),
            ),
            data_tensors_len: 1,
            ..Default::default()
        };
        assert_eq!(decode_chunk(&chunk).unwrap(), vec![t]);
        // Malformed string content is refused, not decoded.
        let bad = TensorProto {
            dtype: DT_STRING,
            tensor_shape: Some(TensorShapeProto::of(&[3])),
            tensor_content: Bytes::from(encode_strings([&b"x"[..], b"y"])),
            ..Default::default()
        };
        let chunk = ChunkData {
            chunk_key: 4,
            data: Bytes::from(ChunkTensors { tensors: vec![bad] }.encode_to_vec()),
            data_tensors_len: 1,
            ..Default::default()
        };
        let e = decode_chunk(&chunk).unwrap_err();
        assert!(
            e.message.contains("Malformed string tensor"),
            "{}",
            e.message
        );
        assert!(Tensor::new(DT_STRING, vec![3], encode_strings([&b"x"[..]])).is_err());
    }

    #[test]
    fn delta_decoding() {
        let deltas: Vec<i32> = vec![1, 2, 1, 1, 1, 1]; // rows [1,2], [2,3], [3,4]
        let data = deltas.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut t = Tensor::new(DataType::DtInt32 as i32, vec![3, 2], data).unwrap();
        delta_decode(&mut t);
        let got: Vec<i32> = t
            .data
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![1, 2, 2, 3, 3, 4]);
    }

    #[test]
    fn delta_round_trip_and_skips_floats() {
        let ints: Vec<u8> = [250u8, 3, 255, 7, 1, 0]
            .iter()
            .flat_map(|v| (*v as i16).to_le_bytes())
            .collect();
        let a = Tensor::new(DataType::DtInt16 as i32, vec![3, 2], ints).unwrap();
        let f = Tensor::new(
            DataType::DtFloat as i32,
            vec![2, 1],
            vec![1, 2, 3, 4, 5, 6, 7, 8],
        )
        .unwrap();
        let v = Tensor::new(DataType::DtUint8 as i32, vec![3], vec![9, 8, 7]).unwrap(); // rank 1
        let chunk = encode_chunk_with(
            3,
            SequenceRange::default(),
            &[a.clone(), f.clone(), v.clone()],
            true,
        );
        assert!(chunk.delta_encoded);
        assert_eq!(decode_chunk(&chunk).unwrap(), vec![a.clone(), f, v]);
        let mut diffed = a.clone();
        delta_encode(&mut diffed);
        assert_ne!(diffed, a);
        delta_decode(&mut diffed);
        assert_eq!(diffed, a);
    }

    #[test]
    fn rejects_inconsistent_tensors() {
        assert!(Tensor::new(DataType::DtFloat as i32, vec![2], vec![0; 7]).is_err());
        assert!(Tensor::new(DataType::DtString as i32, vec![1], vec![]).is_err());
        let mut chunk = encode_chunk(1, SequenceRange::default(), &[]);
        chunk.data = Bytes::from_static(&[0xff, 0xff, 0xff]);
        assert!(decode_chunk(&chunk).is_err());
    }

    proptest::proptest! {
        // (Tensors up to 16 MB: fewer cases.)
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(40))]

        /// Stored tensors are snappy data any snappy reader (the reference's) decompresses
        /// to the bytes, and read in place as those bytes; compressed data is never taken
        /// for stored.
        #[test]
        fn stored_tensors_are_snappy_read_in_place(
            len in proptest::prop_oneof![0usize..300, 60usize..62, 65_530usize..65_600, 16_777_200usize..16_777_230],
            seed in proptest::num::u8::ANY,
        ) {
            let raw: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let mut out = vec![0; snap::raw::max_compress_len(len).max(16)];
            let n = stored(&raw, &mut out);
            let data = &out[..n];
            proptest::prop_assert_eq!(&snap::raw::Decoder::new().decompress_vec(data).unwrap(), &raw);
            proptest::prop_assert_eq!(stored_bytes(data, len), Some(&raw[..]));
            proptest::prop_assert_eq!(stored_bytes(data, len + 1), None);
            proptest::prop_assert_eq!(stored_bytes(&data[..n.saturating_sub(1)], len), None);
            let compressible = vec![seed; len.max(64)];
            let compressed = snap::raw::Encoder::new().compress_vec(&compressible).unwrap();
            proptest::prop_assert_eq!(stored_bytes(&compressed, compressible.len()), None);
        }

    }
}
