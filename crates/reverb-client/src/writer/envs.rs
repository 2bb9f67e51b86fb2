//! The vectorised writer's API (one append of every env's step, items per env, episodes ended
//! per env) and the resolution of history positions (`Steps`) in each env's own episode (the
//! episodes themselves are `episodes`).

use super::columns::Row;
use super::episodes::{Envs, Episode};
use super::pending::build_item;
use super::{AppendError, ItemColumn, TrajectoryWriter, WriterOptions};
use crate::tensor::AsView;
use crate::{Client, ClientError, Result, Tensor};
use std::time::Instant;

/// Which episode steps of each env an item column takes (Python's indexing, relative to
/// the env's episode so far).
#[derive(Debug, Clone)]
pub enum Steps {
    /// One step (negative counts from the end); the column is squeezed.
    Index(i64),
    /// `start:stop:step`, as Python slices them.
    Slice(Option<i64>, Option<i64>, Option<i64>),
    /// These steps, in order.
    List(Vec<i64>),
}

impl Steps {
    /// Episode steps of an env with `len` steps, or an error naming what is out of range.
    fn resolve(&self, len: i64) -> std::result::Result<Vec<i64>, String> {
        let one = |i: i64| {
            let j = if i < 0 { i + len } else { i };
            if (0..len).contains(&j) {
                Ok(j)
            } else {
                Err(format!("history index {i} out of range for {len} steps"))
            }
        };
        match self {
            Steps::Index(i) => Ok(vec![one(*i)?]),
            Steps::List(v) => v.iter().map(|&i| one(i)).collect(),
            Steps::Slice(start, stop, step) => {
                let step = step.unwrap_or(1);
                if step == 0 {
                    return Err("slice step cannot be zero".into());
                }
                let clamp = |v: Option<i64>, default: i64, lo: i64, hi: i64| match v {
                    None => default,
                    Some(v) if v < 0 => (v + len).max(lo),
                    Some(v) => v.min(hi),
                };
                let mut out = Vec::new();
                if step > 0 {
                    let (a, b) = (clamp(*start, 0, 0, len), clamp(*stop, len, 0, len));
                    let mut i = a;
                    while i < b {
                        out.push(i);
                        i = match i.checked_add(step) {
                            Some(next) => next,
                            None => break,
                        };
                    }
                } else {
                    let a = clamp(*start, len - 1, -1, len - 1);
                    let b = clamp(*stop, -1, -1, len - 1);
                    let mut i = a;
                    while i > b {
                        out.push(i);
                        i = match i.checked_add(step) {
                            Some(next) => next,
                            None => break,
                        };
                    }
                }
                Ok(out)
            }
        }
    }
}

impl TrajectoryWriter {
    /// A writer of `envs` parallel episodes, one per environment of a vectorised
    /// environment: each env has its own episode, and every `append_envs` adds one step to
    /// each. Its columns are fields: `column_spec`, `configure` and the env calls take a
    /// field index (the writer keeps a column per field and env).
    pub fn with_envs(client: Client, options: WriterOptions, envs: usize) -> Result<Self> {
        if envs < 1 {
            return Err(ClientError::invalid(format!(
                "num_envs ({envs}) must be >= 1"
            )));
        }
        let mut writer = Self::new(client, options)?;
        writer.envs = Envs::new(envs);
        Ok(writer)
    }

    /// Number of parallel episodes.
    pub fn num_envs(&self) -> usize {
        self.envs.len()
    }

    /// Steps appended in each env's episode.
    pub fn env_steps(&self) -> Vec<u64> {
        self.envs.starts().iter().map(|s| self.step - s).collect()
    }

    /// Writer-wide step of each env's first episode step (cells are addressed by it).
    pub fn env_starts(&self) -> Vec<u64> {
        self.envs.starts()
    }

    /// The cells of `field` at `steps` of `env`'s episode (`None` for expired ones), or the
    /// reason `steps` is out of range there.
    pub fn env_cells(
        &self,
        field: usize,
        env: usize,
        steps: &Steps,
    ) -> Result<std::result::Result<Vec<Option<Tensor>>, String>> {
        let n = self.envs.len();
        if env >= n {
            return Err(ClientError::invalid(format!(
                "env index {env} out of range for num_envs {n}"
            )));
        }
        if let Steps::Slice(_, _, Some(0)) = steps {
            // (Python's own error for a zero step, as `create_env_items` gives it.)
            return Err(ClientError::invalid("slice step cannot be zero"));
        }
        let Episode { start, .. } = self.envs.get(env);
        let len = (self.step - start) as i64;
        let resolved = match steps.resolve(len) {
            Ok(r) => r,
            Err(e) => return Ok(Err(format!("{e} (env {env}'s episode of {len} steps)"))),
        };
        let column = self.envs.column(field, env);
        let cells = resolved
            .into_iter()
            .map(|s| self.columns.read_cell(column, start + s as u64))
            .collect::<Result<Vec<_>>>()?;
        Ok(Ok(cells))
    }

    /// Appends one step to every env: each value `(field, tensor)` has a leading dimension
    /// of `num_envs()`, row `l` going to env `l`. Errors name the field; a failed call
    /// changes nothing.
    pub fn append_envs<V: AsView>(
        &mut self,
        values: Vec<(usize, V)>,
    ) -> std::result::Result<(), AppendError> {
        self.check_error().map_err(AppendError::Other)?;
        let values = super::views(&values);
        let n = self.envs.len();
        if values
            .iter()
            .any(|(_, v)| v.dtype == crate::tensor::DT_STRING)
        {
            return Err(AppendError::Other(ClientError::unimplemented(
                "Vectorised writers do not take string values yet",
            )));
        }
        if let Some((field, value)) = values
            .iter()
            .find(|(_, v)| v.shape.first().copied() != Some(n as i64))
        {
            return Err(AppendError::Other(ClientError::invalid(format!(
                "Every value needs a leading dimension of num_envs ({n}); field {field} has shape {:?}",
                value.shape
            ))));
        }
        let rows = values.iter().map(|(field, value)| Row {
            name: *field,
            column: self.envs.column(*field, 0),
            dtype: value.dtype,
            shape: &value.shape[1..],
        });
        self.columns.check_rows(rows, None)?;
        let step = self.step;
        for (field, value) in &values {
            let row_bytes = value.row_bytes();
            for env in 0..n {
                let row = &value.data[env * row_bytes..(env + 1) * row_bytes];
                let column = self.envs.column(*field, env);
                self.columns.push_row(
                    column,
                    step,
                    value.dtype,
                    &value.shape[1..],
                    row,
                    &self.envs,
                );
            }
        }
        self.step += 1;
        self.steps_closed(1);
        Ok(())
    }

    /// Ends the episodes of `envs`: finalizes their chunks (so their items can leave) and
    /// starts new episodes there; `clear_buffers` drops their history. Does not wait for
    /// confirmations (`flush` does).
    pub fn end_envs(&mut self, envs: &[usize], clear_buffers: bool) -> Result<()> {
        self.check_error()?;
        let n = self.envs.len();
        if let Some(bad) = envs.iter().find(|&&l| l >= n) {
            return Err(ClientError::invalid(format!(
                "env index {bad} out of range for num_envs {n}"
            )));
        }
        for &env in envs {
            let episode = self.envs.get(env);
            let columns: Vec<usize> = self.envs.columns_of(env, self.columns.len()).collect();
            for column in columns {
                self.columns.finalize(column, episode);
                if clear_buffers {
                    self.columns.clear_cells(column);
                }
            }
            self.envs.restart(env, self.step);
        }
        self.pump(Some(Instant::now())).map(|_| ())
    }

    /// Creates one item in `table` per env of `envs`, each from that env's episode:
    /// `columns` are `(field, steps, squeeze)`. `priorities` has one value per env, or one for
    /// all. Checks every item before queuing any. Returns false if it stopped waiting for room
    /// in the in-flight window at `deadline` (the items are queued regardless).
    pub fn create_env_items(
        &mut self,
        table: &str,
        priorities: &[f64],
        envs: &[usize],
        columns: &[(usize, Steps, bool)],
        deadline: Option<Instant>,
    ) -> Result<bool> {
        self.check_error()?;
        let n = self.envs.len();
        if priorities.len() != 1 && priorities.len() != envs.len() {
            return Err(ClientError::invalid(format!(
                "Got {} priorities for {} envs (give one, or one per env)",
                priorities.len(),
                envs.len()
            )));
        }
        let mut items = Vec::with_capacity(envs.len());
        for &env in envs {
            if env >= n {
                return Err(ClientError::invalid(format!(
                    "env index {env} out of range for num_envs {n}"
                )));
            }
            let Episode { start, .. } = self.envs.get(env);
            let len = (self.step - start) as i64;
            let mut item = Vec::with_capacity(columns.len());
            for (i, (field, steps, squeeze)) in columns.iter().enumerate() {
                let column = self.envs.column(*field, env);
                let refs = steps
                    .resolve(len)
                    .map_err(|e| ClientError::invalid(format!("Column {i}, env {env}: {e}")))?
                    .into_iter()
                    .map(|s| (column, start + s as u64))
                    .collect::<Vec<_>>();
                if refs.is_empty() || (*squeeze && refs.len() != 1) {
                    return Err(ClientError::invalid(format!(
                        "Column {i}, env {env}: selects {} steps of {len}{}",
                        refs.len(),
                        if *squeeze {
                            " (a squeezed column needs exactly 1)"
                        } else {
                            ""
                        }
                    )));
                }
                if let Some(&(_, step)) =
                    refs.iter().find(|&&(c, s)| !self.columns.alive(c, &[s])[0])
                {
                    return Err(ClientError::invalid(format!(
                        "Column {i}, env {env}: episode step {} has expired (increase \
                         num_keep_alive_refs) or was never written",
                        step - start
                    )));
                }
                item.push(ItemColumn {
                    refs,
                    squeeze: *squeeze,
                });
            }
            items.push(item);
        }
        let built = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let priority = priorities[if priorities.len() == 1 { 0 } else { i }];
                build_item(
                    self.client.new_item_key(),
                    table,
                    priority,
                    item,
                    &self.columns,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let keyed: Vec<(u64, &[ItemColumn])> = built
            .iter()
            .zip(&items)
            .map(|(b, item)| (b.0, item.as_slice()))
            .collect();
        self.check_or_defer(table, &keyed)?;
        for item in built {
            self.pending.push(item);
        }
        self.ship_promptly();
        self.pump(deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::Steps;

    /// Python's `list(range(len))[index]` for the cases `Steps` mirrors.
    #[test]
    fn steps_resolve_like_python_indexing() {
        type Case = (Steps, i64, Result<Vec<i64>, ()>);
        let cases: &[Case] = &[
            (Steps::Index(-1), 5, Ok(vec![4])),
            (Steps::Index(0), 5, Ok(vec![0])),
            (Steps::Index(5), 5, Err(())),
            (Steps::Index(-6), 5, Err(())),
            (Steps::Slice(Some(-2), None, None), 5, Ok(vec![3, 4])),
            (Steps::Slice(Some(-2), None, None), 1, Ok(vec![0])),
            (Steps::Slice(None, None, None), 3, Ok(vec![0, 1, 2])),
            (
                Steps::Slice(Some(1), Some(10), Some(2)),
                6,
                Ok(vec![1, 3, 5]),
            ),
            (Steps::Slice(None, None, Some(-1)), 3, Ok(vec![2, 1, 0])),
            (
                Steps::Slice(Some(-1), Some(-4), Some(-2)),
                5,
                Ok(vec![4, 2]),
            ),
            (Steps::Slice(Some(10), None, Some(-1)), 3, Ok(vec![2, 1, 0])),
            (Steps::Slice(Some(-10), Some(2), None), 5, Ok(vec![0, 1])),
            (Steps::Slice(Some(3), Some(1), None), 5, Ok(vec![])),
            (Steps::Slice(None, None, Some(0)), 5, Err(())),
            (Steps::List(vec![0, -1, 2]), 4, Ok(vec![0, 3, 2])),
            (Steps::List(vec![4]), 4, Err(())),
            (Steps::Slice(Some(1), None, Some(i64::MAX)), 5, Ok(vec![1])),
            (Steps::Slice(None, None, Some(i64::MIN)), 5, Ok(vec![4])),
        ];
        for (steps, len, want) in cases {
            let got = steps.resolve(*len).map_err(|_| ());
            assert_eq!(&got, want, "{steps:?} of {len}");
        }
    }
}
