//! One-step inserts (`Client.insert`, `TFClient.insert`): each step is a one-step episode of a
//! trajectory writer kept between inserts (one insert stream for all of them), its items
//! sharing the step's chunks, as the reference's legacy writer writes them. A failed or
//! abandoned insert is aborted (the server never stores it later) and the next one starts a
//! fresh stream.

use super::{AppendError, ItemColumn, TrajectoryWriter, WriterOptions};
use crate::tensor::{AsView, TensorView};
use crate::{Client, ClientError, Result};
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tonic::Code;

/// Inserts one step at a time through a kept writer. Not `Sync`: wrap it in a mutex, held
/// for a whole insert (`start` to `wait`'s end: inserts in flight at once would share, and
/// abort, one another's stream).
pub struct Inserter {
    client: Client,
    writer: Option<TrajectoryWriter>,
    /// One writer column per (position, dtype, shape): inserts may change structure.
    columns: HashMap<(usize, i32, Vec<i64>), usize>,
    /// The insert in flight went out on a writer kept from an earlier insert.
    reused: bool,
}

impl Inserter {
    /// An inserter writing through `client` (it connects on the first insert).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            writer: None,
            columns: HashMap::new(),
            reused: false,
        }
    }

    /// Queues `step` (its leaves, without a batch dimension) as one item per
    /// `(table, priority)`; returns the items' keys. [`Inserter::wait`] then waits for the
    /// server to store them. An error aborts the insert.
    pub fn start<V: AsView>(
        &mut self,
        step: &[V],
        priorities: &[(String, f64)],
    ) -> Result<Vec<u64>> {
        if priorities.is_empty() {
            return Err(ClientError::invalid("priorities must not be empty"));
        }
        if step.is_empty() {
            return Err(ClientError::invalid(
                "data must contain at least one tensor",
            ));
        }
        // (A kept writer, even one whose stream died between inserts, e.g. the server
        // restarted: this insert's connection may be the dead one too.)
        self.reused = self.writer.is_some();
        if self.writer.as_ref().is_some_and(TrajectoryWriter::failed) {
            // Its stream died between inserts: start afresh.
            self.writer = None;
        }
        if self.writer.is_none() {
            self.columns.clear();
        }
        let writer = match &mut self.writer {
            Some(writer) => writer,
            None => {
                let options = WriterOptions {
                    num_keep_alive_refs: 1,
                    max_chunk_length: Some(1),
                    // No reconnect loop: a dead server fails the insert at once.
                    reconnect_timeout: Duration::ZERO,
                    ..WriterOptions::default()
                };
                self.columns.clear();
                self.writer
                    .insert(TrajectoryWriter::new(self.client.clone(), options)?)
            }
        };
        let views: Vec<TensorView<'_>> = step.iter().map(AsView::view).collect();
        let columns = column_of(&mut self.columns, &views);
        let values: Vec<(usize, TensorView<'_>)> = columns.into_iter().zip(views).collect();
        let at = writer.episode_start();
        let cells: Vec<ItemColumn> = values
            .iter()
            .map(|&(column, _)| ItemColumn {
                refs: vec![(column, at)],
                squeeze: false,
            })
            .collect();
        let queued = (|| {
            writer.append(values, false).map_err(|e| match e {
                AppendError::Other(e) => e,
                other => ClientError::new(
                    Code::Internal,
                    format!("internal error: insert columns collided ({other:?})"),
                ),
            })?;
            let mut keys = Vec::with_capacity(priorities.len());
            // (Queued without waiting for room in the in-flight window: `wait` does.)
            let now = Some(Instant::now());
            for (table, priority) in priorities {
                keys.push(writer.create_item(table, *priority, &cells, now)?.0);
            }
            writer.end_episode(true);
            Ok(keys)
        })();
        if queued.is_err() {
            self.abort();
        }
        queued
    }

    /// Waits until the server stored the insert in flight (`true`), or until `until`
    /// (`false`: it is still in flight; wait again, or [`Inserter::abort`] it). An error
    /// aborts it.
    pub fn wait(&mut self, until: Option<Instant>) -> Result<bool> {
        let Some(writer) = &mut self.writer else {
            return Ok(true);
        };
        let done = writer.flush(0, until);
        if done.is_err() {
            self.abort();
        }
        done
    }

    /// Gives up the insert in flight: the server never stores what it has not stored yet,
    /// and the next insert starts a fresh stream.
    pub fn abort(&mut self) {
        if let Some(mut writer) = self.writer.take() {
            writer.abort();
        }
    }

    /// Whether a failed insert is tried once more, on a connection of its own: the server
    /// was unavailable to an insert on a stream kept from an earlier one (which may have
    /// died without knowing yet, e.g. the server restarted since).
    pub fn retry_after(&mut self, error: &ClientError) -> bool {
        if !(self.reused && error.code == Code::Unavailable) {
            return false;
        }
        self.reused = false;
        match self.client.reconnected() {
            Ok(client) => {
                self.client = client;
                true
            }
            Err(_) => false,
        }
    }

    /// Inserts `step` (see [`Inserter::start`]) and waits until the server stored its items,
    /// at most until `deadline` (then DEADLINE_EXCEEDED, and the insert is aborted).
    pub fn insert<V: AsView>(
        &mut self,
        step: &[V],
        priorities: &[(String, f64)],
        deadline: Option<Instant>,
    ) -> Result<Vec<u64>> {
        loop {
            let inserted = self.start(step, priorities).and_then(|keys| {
                if self.wait(deadline)? {
                    return Ok(keys);
                }
                self.abort();
                Err(ClientError::deadline(format!(
                    "Timeout exceeded: insert on {} did not complete in time",
                    self.client.address()
                )))
            });
            match inserted {
                Err(e) if self.retry_after(&e) => continue,
                inserted => return inserted,
            }
        }
    }
}

/// The writer column of each leaf of a step: one per (position, dtype, shape), added to
/// `columns` as they first appear.
fn column_of(
    columns: &mut HashMap<(usize, i32, Vec<i64>), usize>,
    leaves: &[TensorView<'_>],
) -> Vec<usize> {
    leaves
        .iter()
        .enumerate()
        .map(|(i, leaf)| {
            let fresh = columns.len();
            *columns
                .entry((i, leaf.dtype, leaf.shape.to_vec()))
                .or_insert(fresh)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tensor;

    fn scalar(dtype: i32, bytes: usize) -> Tensor {
        Tensor::new(dtype, vec![], vec![0; bytes]).unwrap()
    }

    #[test]
    fn each_position_dtype_and_shape_gets_a_column_of_its_own() {
        let steps = [
            vec![scalar(1, 4), scalar(3, 4)],
            vec![scalar(1, 4), scalar(1, 4)],
            vec![scalar(2, 8), scalar(3, 4), scalar(1, 4)],
            vec![scalar(2, 8)],
        ];
        let mut columns = HashMap::new();
        let assigned: Vec<Vec<usize>> = steps
            .iter()
            .map(|step| {
                let views: Vec<TensorView<'_>> = step.iter().map(AsView::view).collect();
                column_of(&mut columns, &views)
            })
            .collect();
        assert_eq!(assigned, [vec![0, 1], vec![0, 2], vec![3, 1, 4], vec![3]]);
    }
}
