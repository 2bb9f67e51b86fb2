//! Checking sampled items against the dtypes and shapes a dataset or `TFClient.sample` declared,
//! and writing them (info and data) into the kernel's outputs.

use crate::kernel::{Context, Error, Result};
use reverb_client::sample::Row;
use reverb_client::signature::{tf_name, Spec as SignatureSpec};
use reverb_client::tensor::{dtype_name, dtype_size, DT_STRING};
use reverb_client::{PlannedSample, Sample, Sampled};
use reverb_proto::{PrioritizedItem, SampleInfo};

/// A sampled item as the kernels see it: decoded (`Sample`, from `Client::sample`) or with
/// its columns still compressed (`PlannedSample`, from the sampler), which are then
/// decompressed straight into the outputs.
pub trait Item {
    fn info(&self) -> &SampleInfo;
    fn num_columns(&self) -> usize;
    fn dtype(&self, c: usize) -> i32;
    fn shape(&self, c: usize) -> &[i64];
    fn byte_len(&self, c: usize) -> usize;
    /// Writes column `c` into `out` (exactly `byte_len(c)` bytes).
    fn write(&self, c: usize, out: &mut [u8]) -> Result<()>;
    /// The elements of string column `c`.
    fn strings(&self, c: usize) -> Result<Vec<Vec<u8>>>;
}

/// The elements of a string tensor, owned.
fn elements(t: &reverb_client::Tensor) -> Result<Vec<Vec<u8>>> {
    Ok(t.strings()?.into_iter().map(<[u8]>::to_vec).collect())
}

impl Item for Sample {
    fn info(&self) -> &SampleInfo {
        &self.info
    }
    fn num_columns(&self) -> usize {
        self.columns.len()
    }
    fn dtype(&self, c: usize) -> i32 {
        self.columns[c].dtype
    }
    fn shape(&self, c: usize) -> &[i64] {
        &self.columns[c].shape
    }
    fn byte_len(&self, c: usize) -> usize {
        self.columns[c].data.len()
    }
    fn write(&self, c: usize, out: &mut [u8]) -> Result<()> {
        out.copy_from_slice(&self.columns[c].data);
        Ok(())
    }
    fn strings(&self, c: usize) -> Result<Vec<Vec<u8>>> {
        elements(&self.columns[c])
    }
}

impl Item for PlannedSample {
    fn info(&self) -> &SampleInfo {
        &self.info
    }
    fn num_columns(&self) -> usize {
        self.columns.len()
    }
    fn dtype(&self, c: usize) -> i32 {
        self.columns[c].dtype
    }
    fn shape(&self, c: usize) -> &[i64] {
        &self.columns[c].shape
    }
    fn byte_len(&self, c: usize) -> usize {
        self.columns[c].byte_len()
    }
    fn write(&self, c: usize, out: &mut [u8]) -> Result<()> {
        Ok(self.columns[c].write_to(out)?)
    }
    fn strings(&self, c: usize) -> Result<Vec<Vec<u8>>> {
        elements(&self.columns[c].to_tensor()?)
    }
}

/// A sample as a dataset kernel queues it: planned, or a row of a batch that arrived as
/// columns (with its info as a message, which the kernels read).
pub enum Queued {
    Planned(PlannedSample),
    Row(SampleInfo, Row),
}

impl Queued {
    /// A sample from a sampler, queued.
    pub fn new(sample: Sampled) -> Result<Self> {
        Ok(match sample {
            Sampled::Row(row) => {
                let (key, probability, table_size, priority, times_sampled) = row.info();
                let item = PrioritizedItem {
                    key,
                    priority,
                    times_sampled,
                    ..Default::default()
                };
                let info = SampleInfo {
                    item: Some(item),
                    probability,
                    table_size,
                    rate_limited: false,
                };
                Queued::Row(info, row)
            }
            other => Queued::Planned(other.plan()?),
        })
    }
}

impl Item for Queued {
    fn info(&self) -> &SampleInfo {
        match self {
            Queued::Planned(p) => p.info(),
            Queued::Row(info, _) => info,
        }
    }
    fn num_columns(&self) -> usize {
        match self {
            Queued::Planned(p) => p.num_columns(),
            Queued::Row(_, row) => row.num_columns(),
        }
    }
    fn dtype(&self, c: usize) -> i32 {
        match self {
            Queued::Planned(p) => p.dtype(c),
            Queued::Row(_, row) => row.column(c).0,
        }
    }
    fn shape(&self, c: usize) -> &[i64] {
        match self {
            Queued::Planned(p) => p.shape(c),
            Queued::Row(_, row) => row.column(c).1,
        }
    }
    fn byte_len(&self, c: usize) -> usize {
        match self {
            Queued::Planned(p) => p.byte_len(c),
            Queued::Row(_, row) => row.column(c).2.len(),
        }
    }
    fn write(&self, c: usize, out: &mut [u8]) -> Result<()> {
        match self {
            Queued::Planned(p) => p.write(c, out),
            Queued::Row(_, row) => {
                out.copy_from_slice(row.column(c).2);
                Ok(())
            }
        }
    }
    fn strings(&self, c: usize) -> Result<Vec<Vec<u8>>> {
        match self {
            Queued::Planned(p) => p.strings(c),
            Queued::Row(..) => Err(Error::invalid(
                "a sample that arrived as columns has no string columns",
            )),
        }
    }
}

const DT_DOUBLE: i32 = 2;
const DT_INT32: i32 = 3;
const DT_INT64: i32 = 9;
const DT_UINT64: i32 = 23;

/// The columns a kernel produces: dtypes, shapes (`None`: any rank; `-1`: any size) and names
/// (column paths, for error messages).
#[derive(Clone)]
pub struct Spec {
    pub table: String,
    pub dtypes: Vec<i32>,
    pub shapes: Vec<Option<Vec<i64>>>,
    pub names: Vec<String>,
}

impl Spec {
    /// Decodes the `shapes` (flattened dims) and `ranks` (-1: unknown) attributes.
    pub fn new(
        table: String,
        dtypes: Vec<i32>,
        ranks: &[i64],
        dims: &[i64],
        names: Vec<String>,
    ) -> Result<Self> {
        if ranks.len() != dtypes.len() || names.len() != dtypes.len() {
            return Err(Error::invalid(format!(
                "{} dtypes but {} shapes and {} names",
                dtypes.len(),
                ranks.len(),
                names.len()
            )));
        }
        let mut shapes = Vec::with_capacity(ranks.len());
        let mut at = 0usize;
        for &r in ranks {
            if r < 0 {
                shapes.push(None);
                continue;
            }
            let end = at + r as usize;
            let s = dims
                .get(at..end)
                .ok_or_else(|| Error::invalid("shapes and ranks do not match"))?;
            shapes.push(Some(s.to_vec()));
            at = end;
        }
        Ok(Self {
            table,
            dtypes,
            shapes,
            names,
        })
    }

    /// The declared columns as the reference prints a table signature (named by their paths
    /// in the declared structure, where the reference prints `?`).
    fn declared(&self) -> String {
        let columns = self.names.iter().zip(&self.dtypes).zip(&self.shapes);
        signature_string(columns.map(|((n, &d), s)| (n.as_str(), d, s.as_deref())))
    }

    /// Checks the declared columns against the table's signature, as the reference does when
    /// a dataset's iterator is made, with its messages.
    pub fn check_signature(&self, signature: &[SignatureSpec]) -> Result<()> {
        let table = &self.table;
        let described = signature_string(
            signature
                .iter()
                .map(|s| (s.name.as_str(), s.dtype, s.shape.as_deref())),
        );
        if signature.len() != self.dtypes.len() {
            return Err(Error::invalid(format!(
                "Inconsistent number of tensors requested from table '{table}'.  Requested {} \
                 tensors, but table signature shows {} tensors.  Table signature: {described}",
                self.dtypes.len(),
                signature.len()
            )));
        }
        for (i, spec) in signature.iter().enumerate() {
            let (dtype, shape) = (self.dtypes[i], self.shapes[i].as_deref());
            if spec.dtype != dtype || !compatible(spec.shape.as_deref(), shape) {
                return Err(Error::invalid(format!(
                    "Requested incompatible tensor at flattened index {i} from table '{table}'.  \
                     Requested (dtype, shape): ({}, {}).  Signature (dtype, shape): ({}, {}).  \
                     Table signature: {described}",
                    tf_name(dtype),
                    tf_shape(shape),
                    tf_name(spec.dtype),
                    tf_shape(spec.shape.as_deref()),
                )));
            }
        }
        Ok(())
    }

    /// Checks one sample; with `timestep`, the declared shapes are those of one step. The
    /// messages are the reference's for a table without a signature.
    pub fn check(&self, s: &impl Item, timestep: bool) -> Result<()> {
        let table = &self.table;
        if s.num_columns() != self.dtypes.len() {
            let incoming = (0..s.num_columns()).map(|c| ("?", s.dtype(c), Some(s.shape(c))));
            return Err(Error::invalid(format!(
                "Inconsistent number of tensors received from table '{table}'.  Specification \
                 has {} tensors, but data coming from the table shows {} tensors.\nTable \
                 signature: {}.\nIncoming tensor signature: {}",
                self.dtypes.len(),
                s.num_columns(),
                self.declared(),
                signature_string(incoming)
            )));
        }
        if timestep {
            steps(s)?;
        }
        for c in 0..s.num_columns() {
            let dtype = s.dtype(c);
            let shape = if timestep {
                &s.shape(c)[1..]
            } else {
                s.shape(c)
            };
            if dtype != self.dtypes[c] || !compatible(self.shapes[c].as_deref(), Some(shape)) {
                return Err(Error::invalid(format!(
                    "Received incompatible tensor at flattened index {c} from table '{table}'.  \
                     Specification has (dtype, shape): ({}, {}).  Tensor has (dtype, shape): \
                     ({}, {}).\nTable signature: {}",
                    tf_name(self.dtypes[c]),
                    tf_shape(self.shapes[c].as_deref()),
                    tf_name(dtype),
                    tf_shape(Some(shape)),
                    self.declared()
                )));
            }
            if dtype_size(dtype).is_none() && dtype != DT_STRING {
                return Err(Error::invalid(format!(
                    "Column '{}' has dtype {}, which the TensorFlow ops do not support yet",
                    self.names[c],
                    dtype_name(dtype)
                )));
            }
        }
        Ok(())
    }
}

/// Whether shapes are compatible as TensorFlow's `TensorShape::IsCompatibleWith` says: an
/// unknown rank fits any shape; otherwise the ranks agree and each size is unknown (-1) on
/// one side or the same.
fn compatible(a: Option<&[i64]>, b: Option<&[i64]>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x < 0 || y < 0 || x == y)
        }
        _ => true,
    }
}

/// A shape as TensorFlow prints one: `[2,?]`, `[]`, `<unknown>` for an unknown rank.
pub fn tf_shape(shape: Option<&[i64]>) -> String {
    match shape {
        None => "<unknown>".into(),
        Some(dims) => {
            let dims: Vec<String> = dims
                .iter()
                .map(|&d| if d < 0 { "?".into() } else { d.to_string() })
                .collect();
            format!("[{}]", dims.join(","))
        }
    }
}

/// Columns (name, dtype, shape) as the reference prints a signature:
/// `0: Tensor<name: 'x', dtype: float, shape: [2,3]>, 1: ...`.
fn signature_string<'a>(
    columns: impl Iterator<Item = (&'a str, i32, Option<&'a [i64]>)>,
) -> String {
    let columns: Vec<String> = columns
        .enumerate()
        .map(|(i, (name, dtype, shape))| {
            format!(
                "{i}: Tensor<name: '{name}', dtype: {}, shape: {}>",
                tf_name(dtype),
                tf_shape(shape)
            )
        })
        .collect();
    columns.join(", ")
}

/// The number of steps of a sample whose columns all have the same leading dimension.
pub fn steps(s: &impl Item) -> Result<usize> {
    let mut n: Option<i64> = None;
    for c in 0..s.num_columns() {
        let Some(&rows) = s.shape(c).first() else {
            return Err(Error::invalid(
                "TimestepDataset needs items whose columns have a time dimension \
                 (an item column is squeezed)",
            ));
        };
        if n.is_some_and(|n| n != rows) {
            return Err(Error::invalid(format!(
                "TimestepDataset needs items whose columns all have the same length (got {} \
                 and {rows})",
                n.unwrap()
            )));
        }
        n = Some(rows);
    }
    Ok(n.unwrap_or(0) as usize)
}

/// Whether two samples' columns have the same shapes (so they can share one batch).
pub fn same_shapes(a: &impl Item, b: &impl Item, timestep: bool) -> bool {
    a.num_columns() == b.num_columns()
        && (0..a.num_columns()).all(|c| {
            let (x, y) = (a.shape(c), b.shape(c));
            if timestep {
                x.get(1..) == y.get(1..)
            } else {
                x == y
            }
        })
}

/// The info outputs, in the order [`write_info`] writes them.
pub const INFO_OUTPUTS: &[&str] = &[
    "key: uint64",
    "probability: double",
    "table_size: int64",
    "priority: double",
    "times_sampled: int32",
];

/// Writes the info outputs (`key, probability, table_size, priority, times_sampled`) starting
/// at output `base`; `dims` is `[rows]` for a batch, `[]` for a scalar.
pub fn write_info(
    ctx: &Context,
    base: usize,
    samples: &[(&impl Item, usize)],
    dims: &[i64],
) -> Result<()> {
    let mut keys = Vec::new();
    let mut probabilities = Vec::new();
    let mut table_sizes = Vec::new();
    let mut priorities = Vec::new();
    let mut times = Vec::new();
    for &(s, repeat) in samples {
        let info = s.info();
        let item = info.item.as_ref();
        for _ in 0..repeat {
            keys.push(item.map_or(0, |i| i.key));
            probabilities.push(info.probability);
            table_sizes.push(info.table_size);
            priorities.push(item.map_or(0.0, |i| i.priority));
            times.push(item.map_or(0, |i| i.times_sampled));
        }
    }
    ctx.output_values(base, DT_UINT64, dims, &keys)?;
    ctx.output_values(base + 1, DT_DOUBLE, dims, &probabilities)?;
    ctx.output_values(base + 2, DT_INT64, dims, &table_sizes)?;
    ctx.output_values(base + 3, DT_DOUBLE, dims, &priorities)?;
    ctx.output_values(base + 4, DT_INT32, dims, &times)
}

/// Writes column `c` of every sample, one after the other, into output `index`. `lead` is the
/// leading dimension (rows) or `None` for a single unbatched sample.
pub fn write_column(
    ctx: &Context,
    index: usize,
    c: usize,
    samples: &[&impl Item],
    lead: Option<usize>,
    timestep: bool,
) -> Result<()> {
    let (dtype, shape) = (samples[0].dtype(c), samples[0].shape(c));
    let mut dims = Vec::with_capacity(shape.len() + 1);
    if let Some(rows) = lead {
        dims.push(rows as i64);
        dims.extend_from_slice(if timestep { &shape[1..] } else { shape });
    } else {
        dims.extend_from_slice(shape);
    }
    if dtype == DT_STRING {
        return ctx.output(index, dtype, &dims, TSTRING_BYTES, |out| {
            let mut slots = out.chunks_exact_mut(TSTRING_BYTES);
            for s in samples {
                for e in s.strings(c)? {
                    let slot = slots
                        .next()
                        .ok_or_else(|| Error::invalid("sampled columns have inconsistent sizes"))?;
                    write_tstring(slot, &e);
                }
            }
            if slots.next().is_some() {
                return Err(Error::invalid("sampled columns have inconsistent sizes"));
            }
            Ok(())
        });
    }
    let elem = dtype_size(dtype).unwrap_or(1);
    ctx.output(index, dtype, &dims, elem, |out| {
        let mut at = 0;
        for s in samples {
            let len = s.byte_len(c);
            let dest = out
                .get_mut(at..at + len)
                .ok_or_else(|| Error::invalid("sampled columns have inconsistent sizes"))?;
            s.write(c, dest)?;
            at += len;
        }
        Ok(())
    })
}

/// Bytes of one `TF_TString` element of a TensorFlow string tensor.
const TSTRING_BYTES: usize = 24;

/// Longest string a `TF_TString` holds inline (its SMALL form).
const TSTRING_SMALL_MAX: usize = 22;

unsafe extern "C" {
    fn malloc(size: usize) -> *mut u8;
}

/// Writes `s` into a freshly allocated (empty) `TF_TString` element: inline when short
/// (SMALL: `size << 2` in the first byte, the bytes after it), else in a malloc'd buffer that
/// TensorFlow frees with the tensor (LARGE: `size << 2 | 1`, capacity, pointer). This is the
/// inline layout `tf_tstring.h` defines (the exported `TF_String*` functions are not visible
/// in every TensorFlow).
pub(crate) fn write_tstring(slot: &mut [u8], s: &[u8]) {
    slot.fill(0);
    if s.len() <= TSTRING_SMALL_MAX {
        slot[0] = (s.len() << 2) as u8;
        slot[1..1 + s.len()].copy_from_slice(s);
        return;
    }
    // SAFETY: malloc returns a buffer of len + 1 bytes (or null, which aborts below) that we
    // fill entirely; TensorFlow takes ownership and frees it with free() (LARGE strings are
    // malloc'd by TensorFlow itself the same way, with a NUL after the bytes).
    let ptr = unsafe {
        let ptr = malloc(s.len() + 1);
        assert!(
            !ptr.is_null(),
            "out of memory for a string of {} bytes",
            s.len()
        );
        std::ptr::copy_nonoverlapping(s.as_ptr(), ptr, s.len());
        *ptr.add(s.len()) = 0;
        ptr
    };
    slot[0..8].copy_from_slice(&((s.len() << 2) | 1).to_le_bytes());
    slot[8..16].copy_from_slice(&s.len().to_le_bytes());
    slot[16..24].copy_from_slice(&(ptr as usize).to_le_bytes());
}
