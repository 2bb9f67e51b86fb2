//! Samples stacked into a batch: one array per column, each sample's column copied (from
//! chunks stored uncompressed) or decompressed straight into its place. Samples a server of
//! this process holds are gathered from its chunks (`gather`); others are planned first.

use super::gather::{gather, DecodedCache};
use crate::sample::Decoded;
use crate::tensor::encode_strings;
use crate::{ClientError, PlannedSample, Result, Sampled, Tensor};

/// A batch: info columns and one stacked tensor per data column.
#[derive(Debug)]
pub struct Batch {
    /// `(key, probability, table_size, priority, times_sampled)` per sample.
    pub info: Vec<(u64, f64, i64, f64, i32)>,
    /// One tensor per column, with a leading batch dimension.
    pub columns: Vec<Tensor>,
}
/// Stacks samples into a batch: every sample must have the same column dtypes and shapes.
/// Each column is copied or decompressed straight into its place in the batch; `cache`
/// keeps compressed chunk tensors decoded for rows of them for the next batches.
pub fn stack(samples: Vec<Sampled>, cache: &mut DecodedCache) -> Result<Batch> {
    let samples = if samples.iter().all(|s| matches!(s, Sampled::Held(_))) {
        let held: Vec<_> = samples
            .into_iter()
            .map(|s| match s {
                Sampled::Held(held) => held,
                Sampled::Planned(_) => unreachable!("all held"),
            })
            .collect();
        if let Some(batch) = gather(&held, cache)? {
            return Ok(batch);
        }
        held.into_iter().map(Sampled::Held).collect()
    } else {
        samples
    };
    let planned = samples
        .into_iter()
        .map(Sampled::plan)
        .collect::<Result<Vec<_>>>()?;
    stack_planned(planned)
}

/// Bytes of a batch of `n` samples of `size` bytes (an error when that cannot be held).
pub(super) fn batch_bytes(n: usize, size: usize) -> Result<usize> {
    size.checked_mul(n)
        .filter(|&t| t <= isize::MAX as usize)
        .ok_or_else(|| ClientError::invalid(format!("A batch of {n} x {size} bytes is too large")))
}

/// Stacks planned samples (see [`stack`]).
pub fn stack_planned(samples: Vec<PlannedSample>) -> Result<Batch> {
    let n = samples.len();
    let Some(first) = samples.first() else {
        return Ok(Batch {
            info: Vec::new(),
            columns: Vec::new(),
        });
    };
    for sample in &samples[1..] {
        if sample.columns.len() != first.columns.len() {
            return Err(ClientError::invalid(format!(
                "Sampled items have different numbers of columns ({} and {}): batch_size must be None",
                first.columns.len(),
                sample.columns.len()
            )));
        }
        for (c, (a, t)) in first.columns.iter().zip(&sample.columns).enumerate() {
            if a.dtype != t.dtype || a.shape != t.shape {
                return Err(ClientError::invalid(format!(
                    "Sampled items differ in column {c} (shapes {:?} and {:?}): they cannot be batched",
                    a.shape, t.shape
                )));
            }
        }
    }
    let mut columns = Vec::with_capacity(first.columns.len());
    // Compressed chunk tensors several samples of the batch take rows of are decoded once
    // per column.
    let mut decoded = Decoded::default();
    for (c, column) in first.columns.iter().enumerate() {
        let mut shape = Vec::with_capacity(column.shape.len() + 1);
        shape.push(n as i64);
        shape.extend_from_slice(&column.shape);
        if column.is_string() {
            // Elements of every sample's column, in order, as one string list.
            let per_sample: usize = column.shape.iter().map(|&d| d as usize).product();
            let tensors = samples
                .iter()
                .map(|s| s.columns[c].to_tensor())
                .collect::<Result<Vec<_>>>()?;
            let mut elements: Vec<&[u8]> = Vec::with_capacity(n * per_sample);
            for t in &tensors {
                elements.extend(t.strings()?);
            }
            columns.push(Tensor {
                dtype: column.dtype,
                shape,
                data: encode_strings(elements.iter().copied()),
            });
            continue;
        }
        let size = column.byte_len();
        let total = batch_bytes(n, size)?;
        let mut data = vec![0u8; total];
        decoded.expect(samples.iter().map(|s| &s.columns[c]));
        for (sample, out) in samples.iter().zip(data.chunks_exact_mut(size.max(1))) {
            sample.columns[c].write_to_with(&mut out[..size], &mut decoded)?;
        }
        columns.push(Tensor {
            dtype: column.dtype,
            shape,
            data,
        });
    }
    let info = samples
        .into_iter()
        .map(|sample| {
            let item = sample.info.item.unwrap_or_default();
            (
                item.key,
                sample.info.probability,
                sample.info.table_size,
                item.priority,
                item.times_sampled,
            )
        })
        .collect();
    Ok(Batch { info, columns })
}
