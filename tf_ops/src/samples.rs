//! Checking sampled items against the dtypes and shapes a dataset or `TFClient.sample` declared,
//! and writing them (info and data) into the kernel's outputs.

use crate::kernel::{Context, Error, Result};
use reverb_client::tensor::dtype_size;
use reverb_client::{Sample, Tensor};

const DT_DOUBLE: i32 = 2;
const DT_INT32: i32 = 3;
const DT_INT64: i32 = 9;
const DT_UINT64: i32 = 23;

/// The columns a kernel produces: dtypes, shapes (`None`: any rank; `-1`: any size) and names
/// (column paths, for error messages).
pub struct Spec {
    pub table: String,
    pub dtypes: Vec<i32>,
    pub shapes: Vec<Option<Vec<i64>>>,
    pub names: Vec<String>,
}

/// TensorFlow's name of a dtype.
pub fn dtype_name(dtype: i32) -> String {
    match dtype {
        1 => "float32",
        2 => "float64",
        3 => "int32",
        4 => "uint8",
        5 => "int16",
        6 => "int8",
        7 => "string",
        8 => "complex64",
        9 => "int64",
        10 => "bool",
        14 => "bfloat16",
        17 => "uint16",
        18 => "complex128",
        19 => "float16",
        22 => "uint32",
        23 => "uint64",
        _ => return format!("dtype {dtype}"),
    }
    .to_string()
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

    /// Checks one sample; with `timestep`, the declared shapes are those of one step.
    pub fn check(&self, s: &Sample, timestep: bool) -> Result<()> {
        if s.columns.len() != self.dtypes.len() {
            return Err(Error::invalid(format!(
                "Items sampled from table '{}' have {} columns but {} dtypes were given",
                self.table,
                s.columns.len(),
                self.dtypes.len()
            )));
        }
        if timestep {
            steps(s)?;
        }
        for (c, t) in s.columns.iter().enumerate() {
            let name = &self.names[c];
            if t.dtype != self.dtypes[c] {
                return Err(Error::invalid(format!(
                    "Column '{name}' of an item sampled from table '{}' has dtype {} but the \
                     declared dtype is {}",
                    self.table,
                    dtype_name(t.dtype),
                    dtype_name(self.dtypes[c])
                )));
            }
            if dtype_size(t.dtype).is_none() {
                return Err(Error::invalid(format!(
                    "Column '{name}' has dtype {}, which the TensorFlow ops do not support yet",
                    dtype_name(t.dtype)
                )));
            }
            let shape = if timestep {
                &t.shape[1..]
            } else {
                &t.shape[..]
            };
            if let Some(expected) = &self.shapes[c] {
                let ok = expected.len() == shape.len()
                    && expected.iter().zip(shape).all(|(&e, &a)| e < 0 || e == a);
                if !ok {
                    let what = if timestep { "step shape" } else { "shape" };
                    return Err(Error::invalid(format!(
                        "Column '{name}' of an item sampled from table '{}' has {what} {shape:?} \
                         but the declared shape is {expected:?}",
                        self.table
                    )));
                }
            }
        }
        Ok(())
    }
}

/// The number of steps of a sample whose columns all have the same leading dimension.
pub fn steps(s: &Sample) -> Result<usize> {
    let mut n: Option<i64> = None;
    for t in &s.columns {
        let Some(&rows) = t.shape.first() else {
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
pub fn same_shapes(a: &Sample, b: &Sample, timestep: bool) -> bool {
    a.columns.len() == b.columns.len()
        && a.columns.iter().zip(&b.columns).all(|(x, y)| {
            if timestep {
                x.shape.get(1..) == y.shape.get(1..)
            } else {
                x.shape == y.shape
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
    samples: &[(&Sample, usize)],
    dims: &[i64],
) -> Result<()> {
    let mut keys = Vec::new();
    let mut probabilities = Vec::new();
    let mut table_sizes = Vec::new();
    let mut priorities = Vec::new();
    let mut times = Vec::new();
    for &(s, repeat) in samples {
        let item = s.info.item.clone().unwrap_or_default();
        for _ in 0..repeat {
            keys.push(item.key);
            probabilities.push(s.info.probability);
            table_sizes.push(s.info.table_size);
            priorities.push(item.priority);
            times.push(item.times_sampled);
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
    samples: &[&Sample],
    lead: Option<usize>,
    timestep: bool,
) -> Result<()> {
    let first: &Tensor = &samples[0].columns[c];
    let mut dims = Vec::with_capacity(first.shape.len() + 1);
    if let Some(rows) = lead {
        dims.push(rows as i64);
        dims.extend_from_slice(if timestep {
            &first.shape[1..]
        } else {
            &first.shape
        });
    } else {
        dims.extend_from_slice(&first.shape);
    }
    let elem = dtype_size(first.dtype).unwrap_or(1);
    ctx.output(index, first.dtype, &dims, elem, |out| {
        let mut at = 0;
        for s in samples {
            let data = &s.columns[c].data;
            out.get_mut(at..at + data.len())
                .ok_or_else(|| Error::invalid("sampled columns have inconsistent sizes"))?
                .copy_from_slice(data);
            at += data.len();
        }
        Ok(())
    })
}
