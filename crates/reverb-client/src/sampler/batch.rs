//! Samples stacked into a batch: one array per column, each sample's column copied (from
//! chunks stored uncompressed) or decompressed straight into its place. Samples a server of
//! this process holds are gathered from its chunks (`gather`); rows that arrived as columns
//! are copied run by run; others are planned first.

use super::gather::{gather, DecodedCache};
use crate::sample::{Columns, Decoded, Row};
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
/// keeps compressed chunk tensors decoded for rows of them for the next batches. Rows that
/// arrived as columns are copied run by run.
pub fn stack(samples: Vec<Sampled>, cache: &mut DecodedCache) -> Result<Batch> {
    // Which samples are rows.
    let order: Vec<bool> = samples
        .iter()
        .map(|s| matches!(s, Sampled::Row(_)))
        .collect();
    if order.iter().all(|&row| row) {
        return stack_rows(&samples);
    }
    if order.iter().any(|&row| row) {
        // (A server answers with entries what it cannot gather: mixed only in odd cases.)
        let (rows, others): (Vec<_>, Vec<_>) = samples
            .into_iter()
            .partition(|s| matches!(s, Sampled::Row(_)));
        let rows = stack_rows(&rows)?;
        let others = stack(others, cache)?;
        return interleave(rows, others, &order);
    }
    let samples = if samples.iter().all(|s| matches!(s, Sampled::Held(_))) {
        let held: Vec<_> = samples
            .into_iter()
            .map(|s| match s {
                Sampled::Held(held) => held,
                _ => unreachable!("all held"),
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

/// Stacks samples that are all rows of batches that arrived as columns: each run of
/// consecutive rows of one batch is one copy per column.
fn stack_rows(samples: &[Sampled]) -> Result<Batch> {
    let rows: Vec<&Row> = samples
        .iter()
        .map(|s| match s {
            Sampled::Row(row) => row,
            _ => unreachable!("all rows"),
        })
        .collect();
    let n = rows.len();
    let Some(first) = rows.first() else {
        return Ok(Batch {
            info: Vec::new(),
            columns: Vec::new(),
        });
    };
    let width = first.batch.columns.len();
    // Runs of consecutive rows of one batch: (batch, first row, rows).
    let mut runs: Vec<(&Columns, usize, usize)> = Vec::new();
    for row in &rows {
        match runs.last_mut() {
            Some((batch, start, len))
                if std::ptr::eq(*batch, &*row.batch) && *start + *len == row.index =>
            {
                *len += 1
            }
            _ => {
                let batch = &*row.batch;
                if !std::ptr::eq(batch, &*first.batch) {
                    same_columns(&first.batch, batch)?;
                }
                runs.push((batch, row.index, 1));
            }
        }
    }
    let mut columns = Vec::with_capacity(width);
    for (c, column) in first.batch.columns.iter().enumerate() {
        let size = column.row_bytes;
        let mut data = Vec::with_capacity(batch_bytes(n, size)?);
        for (batch, start, len) in &runs {
            data.extend_from_slice(&batch.columns[c].data[start * size..(start + len) * size]);
        }
        let mut shape = Vec::with_capacity(column.row_shape.len() + 1);
        shape.push(n as i64);
        shape.extend_from_slice(&column.row_shape);
        columns.push(Tensor {
            dtype: column.dtype,
            shape,
            data,
        });
    }
    let info = rows.iter().map(|r| r.info()).collect();
    Ok(Batch { info, columns })
}

/// An error unless two sets of samples have columns of the same dtypes and shapes (one
/// sample's: `(dtype, shape)` per column).
fn same_layout(a: &[(i32, &[i64])], b: &[(i32, &[i64])]) -> Result<()> {
    if a.len() != b.len() {
        return Err(ClientError::invalid(format!(
            "Sampled items have different numbers of columns ({} and {}): batch_size must be None",
            a.len(),
            b.len()
        )));
    }
    for (c, (x, y)) in a.iter().zip(b).enumerate() {
        if x != y {
            return Err(ClientError::invalid(format!(
                "Sampled items differ in column {c} (shapes {:?} and {:?}): they cannot be batched",
                x.1, y.1
            )));
        }
    }
    Ok(())
}

/// An error unless two batches that arrived as columns have columns of the same dtypes and
/// shapes.
fn same_columns(a: &Columns, b: &Columns) -> Result<()> {
    fn layout(b: &Columns) -> Vec<(i32, &[i64])> {
        b.columns
            .iter()
            .map(|c| (c.dtype, &c.row_shape[..]))
            .collect()
    }
    same_layout(&layout(a), &layout(b))
}

/// One batch of two, their samples taken in `order` (`true`: the next of `a`).
fn interleave(a: Batch, b: Batch, order: &[bool]) -> Result<Batch> {
    fn layout(b: &Batch) -> Vec<(i32, &[i64])> {
        b.columns
            .iter()
            .map(|c| (c.dtype, c.shape.get(1..).unwrap_or(&[])))
            .collect()
    }
    same_layout(&layout(&a), &layout(&b))?;
    let mut columns = Vec::with_capacity(a.columns.len());
    for (x, y) in a.columns.iter().zip(&b.columns) {
        if x.dtype == reverb_proto::payload::DT_STRING {
            return Err(ClientError::invalid(
                "string columns do not arrive as columns",
            ));
        }
        let size = x.row_bytes();
        let mut data = Vec::with_capacity(batch_bytes(order.len(), size)?);
        let (mut i, mut j) = (0, 0);
        for &from_a in order {
            let (src, k) = if from_a { (x, &mut i) } else { (y, &mut j) };
            data.extend_from_slice(&src.data[*k * size..(*k + 1) * size]);
            *k += 1;
        }
        let mut shape = x.shape.clone();
        shape[0] = order.len() as i64;
        columns.push(Tensor {
            dtype: x.dtype,
            shape,
            data,
        });
    }
    let (mut a_info, mut b_info) = (a.info.into_iter(), b.info.into_iter());
    let info = order
        .iter()
        .map(|&from_a| if from_a { a_info.next() } else { b_info.next() }.expect("one per sample"))
        .collect();
    Ok(Batch { info, columns })
}

/// Bytes of a batch of `n` samples of `size` bytes (an error when that cannot be held).
fn batch_bytes(n: usize, size: usize) -> Result<usize> {
    Ok(reverb_proto::gather::batch_bytes(n, size)?)
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
