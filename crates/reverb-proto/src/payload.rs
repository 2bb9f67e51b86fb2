//! What a chunk's payload (`ChunkData.data`, a serialized `ChunkTensors`) holds, read without
//! decompressing it: the dtypes chunks carry, TensorFlow's string-list encoding, and each
//! tensor's header checked against its bytes. Shared by the clients (which decode chunks) and
//! the server (which refuses chunks no client could decode).

use crate::tensorflow::{DataType, TensorProto};
use crate::{ChunkData, ChunkTensors};
use bytes::Bytes;
use prost::encoding::{decode_varint, WireType};
use prost::Message;

/// TensorFlow's `DT_STRING`.
pub const DT_STRING: i32 = DataType::DtString as i32;

/// The fixed-size dtypes chunks carry (the one table of them on the Rust side): TensorFlow
/// `DataType`, numpy's name for it, bytes per element. Strings ([`DT_STRING`]) come apart.
pub const DTYPES: &[(DataType, &str, usize)] = &[
    (DataType::DtFloat, "float32", 4),
    (DataType::DtDouble, "float64", 8),
    (DataType::DtInt32, "int32", 4),
    (DataType::DtUint8, "uint8", 1),
    (DataType::DtInt16, "int16", 2),
    (DataType::DtInt8, "int8", 1),
    (DataType::DtComplex64, "complex64", 8),
    (DataType::DtInt64, "int64", 8),
    (DataType::DtBool, "bool", 1),
    (DataType::DtBfloat16, "bfloat16", 2),
    (DataType::DtUint16, "uint16", 2),
    (DataType::DtComplex128, "complex128", 16),
    (DataType::DtHalf, "float16", 2),
    (DataType::DtUint32, "uint32", 4),
    (DataType::DtUint64, "uint64", 8),
];

fn dtype_entry(dtype: i32) -> Option<&'static (DataType, &'static str, usize)> {
    DTYPES.iter().find(|(d, _, _)| *d as i32 == dtype)
}

/// Bytes per element of a fixed-size dtype; `None` for strings and unknown values.
pub fn dtype_size(dtype: i32) -> Option<usize> {
    dtype_entry(dtype).map(|e| e.2)
}

/// numpy's name of a dtype (`"dtype 7"` for unsupported values).
pub fn dtype_name(dtype: i32) -> String {
    match dtype_entry(dtype) {
        Some(e) => e.1.to_string(),
        None if dtype == DT_STRING => "string".to_string(),
        None => format!("dtype {dtype}"),
    }
}

/// Why a payload cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadError {
    /// The payload is well formed but holds a dtype this code cannot decode.
    pub unsupported: bool,
    /// What is wrong, for people.
    pub message: String,
}

impl PayloadError {
    fn malformed(message: String) -> Self {
        Self {
            unsupported: false,
            message,
        }
    }
}

/// TensorFlow's encoding of a list of strings (the `tensor_content` of a `DT_STRING`
/// `TensorProto`, which the reference's chunks hold uncompressed): the varint length of
/// every element, then the bytes of every element.
pub fn encode_strings<'a, I>(elements: I) -> Vec<u8>
where
    I: IntoIterator<Item = &'a [u8]>,
    I::IntoIter: Clone,
{
    let elements = elements.into_iter();
    let total: usize = elements.clone().map(|e| e.len() + 5).sum();
    let mut out = Vec::with_capacity(total);
    for e in elements.clone() {
        let mut n = e.len() as u64;
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    }
    for e in elements {
        out.extend_from_slice(e);
    }
    out
}

/// The `n` elements of a string list ([`encode_strings`]); an error (saying what is wrong)
/// when it does not hold exactly `n` elements.
pub fn decode_strings(data: &[u8], n: usize) -> Result<Vec<&[u8]>, String> {
    let bad = |what: &str| format!("Malformed string tensor: {what}");
    let mut lengths = Vec::with_capacity(n.min(data.len()));
    let mut at = 0;
    for _ in 0..n {
        let mut len: u64 = 0;
        let mut shift = 0;
        loop {
            let byte = *data
                .get(at)
                .ok_or_else(|| bad("lengths run past its end"))?;
            at += 1;
            len |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 28 {
                return Err(bad("a length is not a 32-bit varint"));
            }
        }
        lengths.push(len as usize);
    }
    let mut out = Vec::with_capacity(n);
    for len in lengths {
        let end = at
            .checked_add(len)
            .filter(|&e| e <= data.len())
            .ok_or_else(|| bad("an element runs past its end"))?;
        out.push(&data[at..end]);
        at = end;
    }
    if at != data.len() {
        return Err(bad("bytes beyond its elements"));
    }
    Ok(out)
}

/// Elements of a shape, when its product fits.
pub fn elements_of(shape: &[i64]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
}

/// One tensor of a chunk, checked but not decompressed.
#[derive(Debug, Clone)]
pub struct TensorPayload {
    /// TensorFlow `DataType` value.
    pub dtype: i32,
    /// Dimensions (all >= 0; the leading one is the rows).
    pub shape: Vec<i64>,
    /// The stored bytes: snappy-compressed (raw block format), or for strings the
    /// uncompressed string list. Shared with the chunk, not copied.
    pub content: Bytes,
    /// Bytes once decompressed.
    pub len: usize,
}

impl TensorPayload {
    /// Number of rows (leading dimension; 1 for a scalar).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1) as usize
    }
}

/// Reads a chunk's tensors: each one's dtype is one chunks carry, its shape fits in memory,
/// and its bytes are what the shape says (snappy's length header for fixed-size dtypes, the
/// whole string list for strings). A string tensor given as `string_val` is returned encoded.
pub fn read_chunk(chunk: &ChunkData) -> Result<Vec<TensorPayload>, PayloadError> {
    match scan_payloads(chunk) {
        Some(tensors) => Ok(tensors),
        None => read_decoded(chunk),
    }
}

/// [`read_chunk`] by decoding the payload as a `ChunkTensors` message (any payload).
fn read_decoded(chunk: &ChunkData) -> Result<Vec<TensorPayload>, PayloadError> {
    let key = chunk.chunk_key;
    let payload = ChunkTensors::decode(chunk.data.clone()).map_err(|e| {
        PayloadError::malformed(format!("Chunk {key} has a malformed payload: {e}"))
    })?;
    // What `string_val`s may expand to, for the whole chunk.
    let mut expansion = MAX_EXPANDED_STRINGS;
    payload
        .tensors
        .into_iter()
        .map(|proto| read_tensor(key, proto, &mut expansion))
        .collect()
}

/// The dtype and shape of each tensor of a chunk: what [`read_chunk`] gives, with its
/// checks and errors, but for the payloads writers send (fixed-size dtypes, each field once)
/// read straight from the wire bytes, without building the messages (a server reads every
/// chunk it receives this way).
pub fn chunk_layouts(chunk: &ChunkData) -> Result<Layouts, PayloadError> {
    match scan_layouts(&chunk.data) {
        Some(layouts) => Ok(layouts),
        None => read_layouts(chunk),
    }
}

/// [`read_chunk`]'s tensors as layouts (decoding the message).
fn read_layouts(chunk: &ChunkData) -> Result<Layouts, PayloadError> {
    let mut layouts = Layouts::default();
    for t in read_decoded(chunk)? {
        let mut layout = Layout::new(t.dtype);
        t.shape.iter().for_each(|&d| layout.push(d));
        layouts.push(layout);
    }
    Ok(layouts)
}

/// Dimensions a [`Layout`] holds without an allocation.
const INLINE_RANK: usize = 6;

/// A tensor's dtype and shape (its leading dimension is its rows), held without an
/// allocation up to a rank of 6: a server reads one for every chunk it receives.
#[derive(Debug, Clone)]
pub struct Layout {
    /// TensorFlow `DataType`.
    pub dtype: i32,
    dims: Dims,
}

#[derive(Debug, Clone)]
enum Dims {
    Inline(u8, [i64; INLINE_RANK]),
    Heap(Vec<i64>),
}

impl Layout {
    /// A layout of rank 0.
    pub fn new(dtype: i32) -> Self {
        Self {
            dtype,
            dims: Dims::Inline(0, [0; INLINE_RANK]),
        }
    }

    /// Appends a dimension.
    pub fn push(&mut self, dim: i64) {
        match &mut self.dims {
            Dims::Inline(rank, dims) if (*rank as usize) < INLINE_RANK => {
                dims[*rank as usize] = dim;
                *rank += 1;
            }
            Dims::Inline(rank, dims) => {
                let mut heap = dims[..*rank as usize].to_vec();
                heap.push(dim);
                self.dims = Dims::Heap(heap);
            }
            Dims::Heap(heap) => heap.push(dim),
        }
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        match &self.dims {
            Dims::Inline(rank, dims) => &dims[..*rank as usize],
            Dims::Heap(heap) => heap,
        }
    }
}

/// The layouts of a chunk's tensors, a single one (a writer's column) held inline.
#[derive(Debug, Clone)]
pub struct Layouts(LayoutList);

#[derive(Debug, Clone)]
enum LayoutList {
    One(Layout),
    Many(Vec<Layout>),
}

impl Default for Layouts {
    fn default() -> Self {
        Self(LayoutList::Many(Vec::new()))
    }
}

impl Layouts {
    /// Appends a tensor's layout.
    pub fn push(&mut self, layout: Layout) {
        self.0 = match std::mem::replace(&mut self.0, LayoutList::Many(Vec::new())) {
            LayoutList::Many(many) if many.is_empty() => LayoutList::One(layout),
            LayoutList::One(one) => LayoutList::Many(vec![one, layout]),
            LayoutList::Many(mut many) => {
                many.push(layout);
                LayoutList::Many(many)
            }
        };
    }
}

/// Equal when dtype and shape are, however they are held.
impl PartialEq for Layout {
    fn eq(&self, other: &Self) -> bool {
        self.dtype == other.dtype && self.shape() == other.shape()
    }
}

impl Eq for Layout {}

/// Equal when the layouts are, however they are held.
impl PartialEq for Layouts {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Layouts {}

impl std::ops::Deref for Layouts {
    type Target = [Layout];

    fn deref(&self) -> &[Layout] {
        match &self.0 {
            LayoutList::One(one) => std::slice::from_ref(one),
            LayoutList::Many(many) => many,
        }
    }
}

/// A protobuf reader over a message's bytes, with prost's decoding of keys and varints, that
/// gives up (`None`) on anything unusual.
struct Wire<'a>(&'a [u8]);

impl<'a> Wire<'a> {
    fn varint(&mut self) -> Option<u64> {
        // (Most varints of a chunk's headers are one byte: read those here.)
        match self.0 {
            [byte, rest @ ..] if *byte < 0x80 => {
                self.0 = rest;
                Some(u64::from(*byte))
            }
            _ => decode_varint(&mut self.0).ok(),
        }
    }

    /// The next field's number and wire type; `None` at the end.
    fn field(&mut self) -> Option<Option<(u32, WireType)>> {
        if self.0.is_empty() {
            return Some(None);
        }
        // A key as prost's `decode_key` reads it: a 32-bit varint, a field number >= 1.
        let key = u32::try_from(self.varint()?).ok()?;
        let wire = WireType::try_from(u64::from(key & 7)).ok()?;
        let field = key >> 3;
        (field >= 1).then_some(Some((field, wire)))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (bytes, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(bytes)
    }
}

const VARINT: WireType = WireType::Varint;
const LEN: WireType = WireType::LengthDelimited;

/// [`chunk_layouts`] of a payload of fixed-size tensors whose fields each appear once, or
/// `None` for anything else (which [`read_chunk`] then reads, or refuses with its error):
/// `Some` only where `read_chunk` accepts the payload and gives these layouts.
fn scan_layouts(payload: &[u8]) -> Option<Layouts> {
    let mut chunk = Wire(payload);
    let mut layouts = Layouts::default();
    while let Some((field, wire)) = chunk.field()? {
        if (field, wire) != (1, LEN) {
            return None;
        }
        layouts.push(scan_tensor(chunk.bytes()?)?.0);
    }
    Some(layouts)
}

/// Tensor `index` of a chunk payload read in place as [`read_chunk`] reads it (its layout,
/// its stored bytes and its size once decompressed), for the payloads writers send
/// (fixed-size dtypes); `None` when the scan does not apply or there is no such tensor.
pub fn scan_tensor_at(payload: &[u8], index: usize) -> Option<(Layout, &[u8], usize)> {
    scan_tensor(tensor_at(payload, index)?)
}

/// Tensor `index` of a chunk payload (a serialized `TensorProto`), found without reading the
/// tensors; `None` when the payload is not a list of tensors or has no such tensor.
fn tensor_at(payload: &[u8], index: usize) -> Option<&[u8]> {
    let mut wire = Wire(payload);
    let mut at = 0;
    while let Some((field, kind)) = wire.field()? {
        if (field, kind) != (1, LEN) {
            return None;
        }
        let tensor = wire.bytes()?;
        if at == index {
            return Some(tensor);
        }
        at += 1;
    }
    None
}

/// [`scan_tensor_at`] over many tensors of one column: a tensor whose bytes before its
/// content are those of the last one read in full (and as long: its content ends it too)
/// has that one's layout, and only its content's size is read.
#[derive(Debug, Default)]
pub struct TensorScan<'a> {
    /// The last tensor read in full whose content ends it: its bytes before the content,
    /// its length, layout and decompressed size.
    last: Option<(&'a [u8], usize, Layout, usize)>,
}

impl<'a> TensorScan<'a> {
    /// What [`scan_tensor_at`] gives for tensor `index` of `payload`.
    pub fn scan(&mut self, payload: &'a [u8], index: usize) -> Option<(Layout, &'a [u8], usize)> {
        let tensor = tensor_at(payload, index)?;
        if let Some((header, tensor_len, layout, len)) = &self.last {
            if tensor.len() == *tensor_len && tensor.starts_with(header) {
                let content = &tensor[header.len()..];
                let stored = snap::raw::decompress_len(content).ok()?;
                return (stored == *len).then(|| (layout.clone(), content, *len));
            }
        }
        let (layout, content, len) = scan_tensor(tensor)?;
        let start = (content.as_ptr() as usize).wrapping_sub(tensor.as_ptr() as usize);
        if !content.is_empty() && start.checked_add(content.len()) == Some(tensor.len()) {
            self.last = Some((&tensor[..start], tensor.len(), layout.clone(), len));
        }
        Some((layout, content, len))
    }
}

/// [`read_chunk`]'s tensors read as [`scan_layouts`] reads them (no message decoded, no
/// copy: contents are slices of the payload); `None` when the scan does not apply.
fn scan_payloads(chunk: &ChunkData) -> Option<Vec<TensorPayload>> {
    let payload = &chunk.data[..];
    let mut wire = Wire(payload);
    let mut out = Vec::new();
    while let Some((field, kind)) = wire.field()? {
        if (field, kind) != (1, LEN) {
            return None;
        }
        let (layout, content, len) = scan_tensor(wire.bytes()?)?;
        let content = if content.is_empty() {
            Bytes::new()
        } else {
            chunk.data.slice_ref(content)
        };
        out.push(TensorPayload {
            dtype: layout.dtype,
            shape: layout.shape().to_vec(),
            content,
            len,
        });
    }
    Some(out)
}

/// A tensor's layout, stored bytes and decompressed size, if it is a fixed-size tensor
/// whose bytes are what its shape says.
fn scan_tensor(tensor: &[u8]) -> Option<(Layout, &[u8], usize)> {
    let mut wire = Wire(tensor);
    let (mut dtype, mut shape, mut content) = (None, None, None);
    while let Some((field, kind)) = wire.field()? {
        match (field, kind) {
            (1, VARINT) if dtype.is_none() => dtype = Some(wire.varint()? as i32),
            (2, LEN) if shape.is_none() => {
                let mut layout = Layout::new(0);
                scan_shape(wire.bytes()?, &mut layout)?;
                shape = Some(layout);
            }
            (3, VARINT) => {
                wire.varint()?;
            }
            (4, LEN) if content.is_none() => content = Some(wire.bytes()?),
            _ => return None,
        }
    }
    let (dtype, content) = (dtype?, content.unwrap_or(&[]));
    let mut layout = shape.unwrap_or_else(|| Layout::new(dtype));
    layout.dtype = dtype;
    let shape = layout.shape();
    let size = dtype_size(dtype)?;
    if shape.iter().any(|&d| d < 0) {
        return None;
    }
    let len = shape
        .iter()
        .skip(1)
        .try_fold(size, |n, &d| n.checked_mul(d as usize))
        .filter(|&n| n <= isize::MAX as usize)?
        .checked_mul(shape.first().map_or(1, |&d| d as usize))
        .filter(|&n| n <= isize::MAX as usize)?;
    let stored = if len == 0 && content.is_empty() {
        0
    } else {
        snap::raw::decompress_len(content).ok()?
    };
    (stored == len).then_some((layout, content, len))
}

/// Reads a `TensorShapeProto`'s dimensions into `layout`.
fn scan_shape(shape: &[u8], layout: &mut Layout) -> Option<()> {
    let mut wire = Wire(shape);
    while let Some((field, kind)) = wire.field()? {
        match (field, kind) {
            (2, LEN) => {
                let mut dim = Wire(wire.bytes()?);
                let mut size = None;
                while let Some((field, kind)) = dim.field()? {
                    match (field, kind) {
                        (1, VARINT) if size.is_none() => size = Some(dim.varint()? as i64),
                        _ => return None,
                    }
                }
                layout.push(size.unwrap_or(0));
            }
            (3, VARINT) => {
                wire.varint()?;
            }
            _ => return None,
        }
    }
    Some(())
}

fn read_tensor(
    key: u64,
    proto: TensorProto,
    expansion: &mut usize,
) -> Result<TensorPayload, PayloadError> {
    let shape: Vec<i64> = proto
        .tensor_shape
        .as_ref()
        .map(|s| s.dim.iter().map(|d| d.size).collect())
        .unwrap_or_default();
    if shape.iter().any(|&d| d < 0) {
        return Err(PayloadError::malformed(format!(
            "Chunk {key}: negative dimension in shape {shape:?}"
        )));
    }
    if proto.dtype == DT_STRING {
        return read_strings(key, proto, shape, expansion);
    }
    let size = dtype_size(proto.dtype).ok_or_else(|| PayloadError {
        unsupported: true,
        message: format!(
            "Chunk {key} holds a tensor of dtype {} which this client cannot decode yet",
            proto.dtype
        ),
    })?;
    // Every partial product must fit, not only the total: a zero leading dimension must not
    // hide an overflowing row size.
    let too_large =
        || PayloadError::malformed(format!("Chunk {key}: shape {shape:?} is too large"));
    let row = shape
        .iter()
        .skip(1)
        .try_fold(size, |n, &d| n.checked_mul(d as usize))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(too_large)?;
    let len = row
        .checked_mul(shape.first().map_or(1, |&d| d as usize))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(too_large)?;
    // The size the shape claims must be what the payload holds (snappy's header says so),
    // before anyone allocates for it.
    let stored = if len == 0 && proto.tensor_content.is_empty() {
        0
    } else {
        snap::raw::decompress_len(&proto.tensor_content).map_err(|e| {
            PayloadError::malformed(format!("Chunk {key} could not be decompressed: {e}"))
        })?
    };
    if stored != len {
        return Err(PayloadError::malformed(format!(
            "Chunk {key}: a tensor of shape {shape:?} needs {len} bytes but its payload holds \
             {stored}"
        )));
    }
    Ok(TensorPayload {
        dtype: proto.dtype,
        shape,
        content: proto.tensor_content,
        len,
    })
}

/// The most bytes the string tensors of one chunk given as (a few repeated) `string_val`s may
/// expand to, together.
const MAX_EXPANDED_STRINGS: usize = 1 << 26;

/// A string tensor: from `tensor_content` (as the reference's chunks and ours carry it) or
/// `string_val`; its encoding is checked here, once.
fn read_strings(
    key: u64,
    proto: TensorProto,
    shape: Vec<i64>,
    expansion: &mut usize,
) -> Result<TensorPayload, PayloadError> {
    let n = elements_of(&shape).ok_or_else(|| {
        PayloadError::malformed(format!("Chunk {key}: bad string tensor shape {shape:?}"))
    })?;
    let content = if proto.tensor_content.is_empty() && !proto.string_val.is_empty() {
        // As in TensorFlow, fewer values than elements repeat the last one; a few bytes must
        // not expand into more than a message could carry.
        let last = proto.string_val.last().expect("not empty");
        let given: usize = proto.string_val.iter().map(|v| v.len() + 5).sum();
        let expanded = n
            .saturating_sub(proto.string_val.len())
            .checked_mul(last.len() + 5)
            .and_then(|n| n.checked_add(given))
            .filter(|&n| n <= *expansion);
        if let Some(n) = expanded {
            *expansion -= n;
        } else {
            return Err(PayloadError::malformed(format!(
                "Chunk {key}: {} string values of shape {shape:?} take its string values past {MAX_EXPANDED_STRINGS} \
                 bytes",
                proto.string_val.len()
            )));
        }
        let values = (0..n).map(|i| &proto.string_val.get(i).unwrap_or(last)[..]);
        Bytes::from(encode_strings(values))
    } else {
        proto.tensor_content
    };
    decode_strings(&content, n)
        .map_err(|e| PayloadError::malformed(format!("Chunk {key}: {e}")))?;
    Ok(TensorPayload {
        dtype: DT_STRING,
        shape,
        len: content.len(),
        content,
    })
}

/// The bytes of snappy data written as one literal of the whole length (how writers store
/// tensors whose compression does not pay), if it is such: they are the uncompressed bytes,
/// read in place.
pub fn stored_bytes(content: &[u8], len: usize) -> Option<&[u8]> {
    // The length: a varint of at most 5 bytes and 32 bits, as snappy reads it.
    let mut at = 0;
    let mut n: u64 = 0;
    loop {
        let b = *content.get(at)?;
        n |= u64::from(b & 0x7f) << (7 * at);
        at += 1;
        if b & 0x80 == 0 {
            break;
        }
        if at == 5 {
            return None;
        }
    }
    if n > u64::from(u32::MAX) || n != len as u64 {
        return None;
    }
    if len == 0 {
        return (at == content.len()).then_some(&[]);
    }
    let tag = *content.get(at)?;
    at += 1;
    if tag & 3 != 0 {
        return None; // (a copy, not a literal)
    }
    let literal = match tag >> 2 {
        short @ 0..=59 => u64::from(short),
        long => {
            let bytes = usize::from(long - 59);
            let mut v = 0u64;
            for i in 0..bytes {
                v |= u64::from(*content.get(at + i)?) << (8 * i);
            }
            at += bytes;
            v
        }
    } + 1;
    (literal == len as u64 && content.len() == at + len).then(|| &content[at..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensorflow::{tensor_shape_proto::Dim, TensorShapeProto};
    use proptest::prelude::*;

    fn strings(n: i64, values: &[&[u8]]) -> TensorProto {
        TensorProto {
            dtype: DT_STRING,
            tensor_shape: Some(TensorShapeProto::of(&[n])),
            string_val: values.iter().map(|v| Bytes::copy_from_slice(v)).collect(),
            ..Default::default()
        }
    }

    fn chunk(tensors: Vec<TensorProto>) -> ChunkData {
        ChunkData {
            chunk_key: 9,
            data: ChunkTensors { tensors }.encode_to_vec().into(),
            ..Default::default()
        }
    }

    #[test]
    fn repeated_string_values_expand_within_one_bound_per_chunk() {
        let read = read_chunk(&chunk(vec![strings(3, &[b"a", b"bc"])])).unwrap();
        let elements = decode_strings(&read[0].content, 3).unwrap();
        assert_eq!(elements, vec![&b"a"[..], b"bc", b"bc"]);
        // One value repeated past the bound, in one tensor or over many.
        let huge = MAX_EXPANDED_STRINGS as i64;
        assert!(read_chunk(&chunk(vec![strings(huge, &[b"x"])])).is_err());
        let many = (0..100).map(|_| strings(huge / 50, &[b"x"])).collect();
        let err = read_chunk(&chunk(many)).unwrap_err();
        assert!(err.message.contains("past"), "{}", err.message);
    }

    #[test]
    fn writers_chunks_are_scanned() {
        let tensor = |dtype: DataType, dims: &[i64], bytes: usize| TensorProto {
            dtype: dtype as i32,
            tensor_shape: Some(TensorShapeProto::of(dims)),
            tensor_content: snap::raw::Encoder::new()
                .compress_vec(&vec![3u8; bytes])
                .unwrap()
                .into(),
            ..Default::default()
        };
        let good = chunk(vec![
            tensor(DataType::DtFloat, &[2, 8], 64),
            tensor(DataType::DtInt32, &[2], 8),
            tensor(DataType::DtUint8, &[0, 84, 84], 0),
        ]);
        let want = [
            (DataType::DtFloat as i32, vec![2, 8]),
            (DataType::DtInt32 as i32, vec![2]),
            (DataType::DtUint8 as i32, vec![0, 84, 84]),
        ];
        let got = chunk_layouts(&good).unwrap();
        let got: Vec<(i32, Vec<i64>)> = got.iter().map(|l| (l.dtype, l.shape().to_vec())).collect();
        assert_eq!(got, want);
        assert_eq!(
            scan_layouts(&good.data),
            Some(chunk_layouts(&good).unwrap())
        );
        // A payload whose size disagrees with its shape is left to read_chunk, which says so.
        let bad = chunk(vec![tensor(DataType::DtFloat, &[2, 8], 60)]);
        assert_eq!(scan_layouts(&bad.data), None);
        assert_eq!(chunk_layouts(&bad), read_layouts(&bad));
        assert!(chunk_layouts(&bad).is_err());
    }

    #[test]
    fn layouts_of_any_rank_and_count() {
        let mut layouts = Layouts::default();
        assert!(layouts.is_empty());
        for n in 0..10 {
            let mut layout = Layout::new(n as i32);
            (0..n).for_each(|d| layout.push(d as i64 * 10));
            assert_eq!(
                layout.shape(),
                (0..n).map(|d| d as i64 * 10).collect::<Vec<_>>()
            );
            layouts.push(layout);
            assert_eq!(layouts.len(), n + 1);
            assert!(layouts
                .iter()
                .enumerate()
                .all(|(i, l)| l.dtype == i as i32 && l.shape().len() == i));
        }
    }

    /// A fixed-size tensor of a writer's kind (its content set by the test).
    fn fixed_tensor() -> impl Strategy<Value = TensorProto> {
        let dtypes = prop_oneof![
            Just(DataType::DtFloat as i32),
            Just(DataType::DtUint8 as i32),
            Just(DataType::DtInt64 as i32),
        ];
        (dtypes, proptest::collection::vec(0i64..5, 0..3)).prop_map(|(dtype, dims)| TensorProto {
            dtype,
            tensor_shape: Some(TensorShapeProto::of(&dims)),
            ..Default::default()
        })
    }

    fn arb_tensor() -> impl Strategy<Value = TensorProto> {
        let dtypes = prop_oneof![
            Just(DataType::DtFloat as i32),
            Just(DataType::DtUint8 as i32),
            Just(DataType::DtInt64 as i32),
            Just(DT_STRING),
            Just(0),
            Just(-3),
            Just(1 << 20),
        ];
        let dims = proptest::collection::vec(-2i64..5, 0..4);
        let names = prop_oneof![Just(String::new()), Just("x".to_string())];
        (
            dtypes,
            dims,
            names,
            0usize..200,
            any::<bool>(),
            any::<bool>(),
            0usize..3,
        )
            .prop_map(
                |(dtype, dims, name, bytes, compress, unknown_rank, strings)| {
                    let raw = vec![1u8; bytes];
                    TensorProto {
                        dtype,
                        tensor_shape: Some(TensorShapeProto {
                            dim: dims
                                .into_iter()
                                .map(|size| Dim {
                                    size,
                                    name: name.clone(),
                                })
                                .collect(),
                            unknown_rank,
                        }),
                        version_number: bytes as i32 % 3,
                        tensor_content: if compress {
                            snap::raw::Encoder::new().compress_vec(&raw).unwrap().into()
                        } else {
                            raw.into()
                        },
                        string_val: (0..strings).map(|_| Bytes::from_static(b"ab")).collect(),
                        ..Default::default()
                    }
                },
            )
    }

    proptest::proptest! {
        // Wherever the scan gives layouts, read_chunk accepts the chunk and gives the same;
        // and a chunk read_chunk accepts with fixed-size tensors only is scanned.
        #[test]
        fn the_scan_agrees_with_read_chunk(tensors in proptest::collection::vec(arb_tensor(), 0..4)) {
            let simple = tensors.iter().all(|t| t.string_val.is_empty()
                && t.tensor_shape.as_ref().is_some_and(|s| s.dim.iter().all(|d| d.name.is_empty())));
            let chunk = chunk(tensors);
            let scanned = scan_layouts(&chunk.data);
            let read = read_layouts(&chunk);
            if let Some(layouts) = &scanned {
                proptest::prop_assert_eq!(Ok(layouts.clone()), read.clone());
            }
            if let Some(payloads) = scan_payloads(&chunk) {
                let decoded = read_decoded(&chunk).expect("scanned chunks decode");
                proptest::prop_assert_eq!(payloads.len(), decoded.len());
                for (a, b) in payloads.iter().zip(&decoded) {
                    proptest::prop_assert_eq!((a.dtype, &a.shape, &a.content, a.len), (b.dtype, &b.shape, &b.content, b.len));
                }
            } else {
                proptest::prop_assert!(scanned.is_none());
            }
            let fixed = read.as_ref().is_ok_and(|l| l.iter().all(|l| l.dtype != DT_STRING));
            if simple && fixed {
                proptest::prop_assert!(scanned.is_some());
            }
            proptest::prop_assert_eq!(chunk_layouts(&chunk), read);
        }

        // A column's tensors scanned in turn by one TensorScan read as each read alone: of a
        // few layouts, their contents of the right size or not, compressed or stored.
        #[test]
        fn a_column_scan_reads_each_tensor_as_alone(
            templates in proptest::collection::vec(prop_oneof![3 => fixed_tensor(), 1 => arb_tensor()], 1..4),
            tensors in proptest::collection::vec((0usize..4, any::<u8>(), 0usize..3, any::<bool>(), 0usize..3), 1..24),
        ) {
            let payloads: Vec<(Vec<u8>, usize)> = tensors
                .iter()
                .map(|&(t, fill, off, compress, index)| {
                    let mut tensor = templates[t % templates.len()].clone();
                    // Bytes of the size its shape gives, one less or one more.
                    let dims: Vec<i64> = tensor.tensor_shape.iter().flat_map(|s| s.dim.iter().map(|d| d.size)).collect();
                    let right = elements_of(&dims)
                        .zip(dtype_size(tensor.dtype))
                        .map_or(8, |(n, d)| n.saturating_mul(d).min(4096));
                    let raw = vec![fill; (right + off).saturating_sub(1)];
                    tensor.tensor_content = if compress {
                        snap::raw::Encoder::new().compress_vec(&raw).unwrap().into()
                    } else {
                        Bytes::from(raw)
                    };
                    // The tensor at `index`, after another when 1; when 2, with a field after
                    // its content (version_number: which prost never writes there).
                    let mut bytes = tensor.encode_to_vec();
                    if index == 2 {
                        bytes.extend_from_slice(&[3 << 3, 1]);
                    }
                    let mut payload = Vec::new();
                    if index == 1 {
                        payload = ChunkTensors { tensors: vec![templates[0].clone()] }.encode_to_vec();
                    }
                    payload.push(1 << 3 | 2);
                    prost::encoding::encode_varint(bytes.len() as u64, &mut payload);
                    payload.extend_from_slice(&bytes);
                    (payload, usize::from(index == 1))
                })
                .collect();
            let mut scan = TensorScan::default();
            for (payload, index) in &payloads {
                let alone = scan_tensor_at(payload, *index);
                let column = scan.scan(payload, *index);
                let key = |r: &Option<(Layout, &[u8], usize)>| r.as_ref().map(|(l, c, n)| (l.clone(), c.to_vec(), *n));
                proptest::prop_assert_eq!(key(&column), key(&alone));
            }
        }

        // Any bytes at all: the scan never accepts what read_chunk refuses.
        #[test]
        fn the_scan_accepts_nothing_read_chunk_refuses(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let chunk = ChunkData { chunk_key: 1, data: bytes.into(), ..Default::default() };
            if let Some(layouts) = scan_layouts(&chunk.data) {
                proptest::prop_assert_eq!(Ok(layouts), read_layouts(&chunk));
            }
        }
    }
}
