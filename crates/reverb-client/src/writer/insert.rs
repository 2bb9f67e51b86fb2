//! Inserts of steps as items (`Client.insert`, `TFClient.insert`: one step; `Client.insert_steps`:
//! N steps, N items per table): each insert is an episode of a trajectory writer kept between
//! inserts (one insert stream for all of them), each item holding one step, its items sharing
//! the insert's chunks (sized automatically: one step's for a single insert, as the
//! reference's legacy writer writes it). A failed or abandoned insert is aborted (the server never stores it
//! later) and the next one starts a fresh stream.

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
    /// The most steps one insert of the kept writer may hold (the steps it keeps
    /// referenceable).
    capacity: usize,
    /// One writer column per (position, dtype, shape): inserts may change structure.
    columns: HashMap<(usize, i32, Vec<i64>), usize>,
    /// The insert in flight went out on a writer kept from an earlier insert.
    reused: bool,
    /// Items the kept writer had confirmed when the insert in flight started.
    confirmed_before: u64,
    /// The insert that failed last had items confirmed (it is not tried again: they
    /// would be stored twice).
    partly_stored: bool,
}

impl Inserter {
    /// An inserter writing through `client` (it connects on the first insert).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            writer: None,
            capacity: 0,
            columns: HashMap::new(),
            reused: false,
            confirmed_before: 0,
            partly_stored: false,
        }
    }

    /// The kept writer, made afresh when there is none, its stream died, or it keeps fewer
    /// than `steps` steps referenceable. Its chunks are sized automatically, as a trajectory
    /// writer's (about 16 KB per column, a single insert's one step): the steps of one
    /// insert share them (a learner sampling over gRPC receives a sampled item's chunks
    /// whole, as with any writer's).
    fn writer_for(&mut self, steps: usize) -> Result<()> {
        let fits = self
            .writer
            .as_ref()
            .is_some_and(|w| !w.failed() && self.capacity >= steps);
        // (A kept writer, even one whose stream died between inserts, e.g. the server
        // restarted: this insert's connection may be the dead one too.)
        self.reused = fits;
        if !fits {
            // Its stream died between inserts (or it keeps too few steps): start afresh.
            self.writer = None;
            self.columns.clear();
            let capacity = steps.max(self.capacity).max(1);
            let options = WriterOptions {
                num_keep_alive_refs: capacity,
                max_chunk_length: None,
                // No reconnect loop: a dead server fails the insert at once.
                reconnect_timeout: Duration::ZERO,
                ..WriterOptions::default()
            };
            self.writer = Some(TrajectoryWriter::new(self.client.clone(), options)?);
            self.capacity = capacity;
        }
        self.confirmed_before = self.writer.as_ref().expect("made above").confirmed();
        self.partly_stored = false;
        Ok(())
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
        self.writer_for(1)?;
        let writer = self.writer.as_mut().expect("made above");
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
            writer.append(values, false).map_err(append_error)?;
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

    /// Queues `steps` (its leaves, each with a leading dimension of N >= 1 steps) as N items
    /// per `(table, priorities)` (one priority per step), item `i` holding step `i` as
    /// [`Inserter::start`] would; returns the items' keys, table by table.
    /// [`Inserter::wait`] then waits for the server to store them. An error aborts the insert.
    pub fn start_steps<V: AsView>(
        &mut self,
        steps: &[V],
        priorities: &[(String, Vec<f64>)],
    ) -> Result<Vec<u64>> {
        let views: Vec<TensorView<'_>> = steps.iter().map(AsView::view).collect();
        let n = steps_of(&views, priorities)?;
        self.writer_for(n)?;
        let writer = self.writer.as_mut().expect("made above");
        let rows: Vec<TensorView<'_>> = views
            .iter()
            .map(|v| TensorView {
                shape: &v.shape[1..],
                ..*v
            })
            .collect();
        let columns = column_of(&mut self.columns, &rows);
        let at = writer.episode_start();
        let queued = (|| {
            let values: Vec<(usize, TensorView<'_>)> =
                columns.iter().copied().zip(views.iter().copied()).collect();
            writer.append_steps(values).map_err(append_error)?;
            let mut keys = Vec::with_capacity(n * priorities.len());
            let mut cells: Vec<ItemColumn> = columns
                .iter()
                .map(|&column| ItemColumn {
                    refs: vec![(column, at)],
                    squeeze: false,
                })
                .collect();
            // Queued only: `wait` sends them all (sending as they are created would work out
            // the chunks to keep once per item).
            writer.check_error()?;
            for (table, priorities) in priorities {
                for (i, priority) in priorities.iter().enumerate() {
                    for (cell, &column) in cells.iter_mut().zip(&columns) {
                        cell.refs[0] = (column, at + i as u64);
                    }
                    keys.push(writer.queue_item(table, *priority, &cells)?);
                }
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
            self.partly_stored = writer.confirmed() > self.confirmed_before;
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
    /// died without knowing yet, e.g. the server restarted since), and stored none of it.
    pub fn retry_after(&mut self, error: &ClientError) -> bool {
        if !(self.reused && error.code == Code::Unavailable) || self.partly_stored {
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

/// The number of steps N of an insert of `steps` (leaves with a leading dimension N >= 1,
/// the same for all) with one priority per step for each table.
pub(super) fn steps_of(
    steps: &[TensorView<'_>],
    priorities: &[(String, Vec<f64>)],
) -> Result<usize> {
    if priorities.is_empty() {
        return Err(ClientError::invalid("priorities must not be empty"));
    }
    let n = match steps.first() {
        None => {
            return Err(ClientError::invalid(
                "data must contain at least one tensor",
            ))
        }
        Some(v) => v.shape.first().copied().unwrap_or(0),
    };
    if n < 1 || steps.iter().any(|v| v.shape.first() != Some(&n)) {
        return Err(ClientError::invalid(
            "insert_steps needs every value to have the same leading (step) dimension, >= 1",
        ));
    }
    let n = n as usize;
    if let Some((table, p)) = priorities.iter().find(|(_, p)| p.len() != n) {
        return Err(ClientError::invalid(format!(
            "table '{table}' has {} priorities for {n} steps",
            p.len()
        )));
    }
    Ok(n)
}

/// An append's error as an insert reports it (each leaf has a column of its own, so only a
/// bug makes two collide).
fn append_error(e: AppendError) -> ClientError {
    match e {
        AppendError::Other(e) => e,
        other => ClientError::new(
            Code::Internal,
            format!("internal error: insert columns collided ({other:?})"),
        ),
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
