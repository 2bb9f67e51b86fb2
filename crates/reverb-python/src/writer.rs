//! `reverb._native.TrajectoryWriter`: the native half of `TrajectoryWriter`,
//! `VectorTrajectoryWriter` and `Client.insert`.

use crate::blocking::{deadline_ms, locked, with_views};
use crate::client::PyClient;
use crate::column::column_leaves;
use crate::errors::{client_error, IntoPyResult};
use crate::layout::{Flat, PyStepColumns};
use crate::numpy::{column_out, to_array};
use crate::tables::{TablesFetch, TABLES_GRACE};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use reverb_client::tensor::TensorView;
use reverb_client::writer::{
    AppendError, ItemColumn, Steps, TrajectoryWriter, WriterOptions, TABLES_TIMEOUT,
};
use reverb_client::ClientError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why an append was refused, naming the writer column (Python names its path). Returned,
/// not raised: the caller turns it into the error its users expect.
#[pyclass(name = "AppendError", module = "reverb._native", frozen, get_all)]
pub(crate) struct PyAppendError {
    /// The writer column (a field, for vectorised writers).
    column: usize,
    /// The column already has a value in the open step.
    already_set: bool,
    /// `(dtype, row shape)` the column holds, when the value did not match it.
    expected: Option<(i32, Vec<i64>)>,
    /// `(dtype, row shape)` of the value, when it did not match the column.
    got: Option<(i32, Vec<i64>)>,
}

/// An append's outcome for Python: None, an [`PyAppendError`], or a raised error.
pub(crate) fn append_error(py: Python<'_>, e: AppendError) -> PyResult<Option<Py<PyAppendError>>> {
    let error = match e {
        AppendError::AlreadySet(column) => PyAppendError {
            column,
            already_set: true,
            expected: None,
            got: None,
        },
        AppendError::Mismatch {
            column,
            expected,
            got,
        } => PyAppendError {
            column,
            already_set: false,
            expected: Some(expected),
            got: Some(got),
        },
        AppendError::Other(e) => return Err(client_error(e)),
    };
    Ok(Some(Py::new(py, error)?))
}

/// History positions from Python: an int, a `(start, stop, step)` tuple or a list of ints.
fn steps_of(steps: &Bound<'_, PyAny>) -> PyResult<Steps> {
    if let Ok(i) = steps.extract::<i64>() {
        Ok(Steps::Index(i))
    } else if let Ok((a, b, c)) = steps.extract::<(Option<i64>, Option<i64>, Option<i64>)>() {
        Ok(Steps::Slice(a, b, c))
    } else {
        Ok(Steps::List(steps.extract::<Vec<i64>>()?))
    }
}

/// Native half of `reverb.TrajectoryWriter`. Calls from several threads are serialized.
#[pyclass(name = "TrajectoryWriter", module = "reverb._native", frozen)]
pub(crate) struct PyTrajectoryWriter {
    pub(crate) inner: Arc<Mutex<TrajectoryWriter>>,
    /// With `validate_items`: the server's tables, fetched in the background. Items created
    /// meanwhile are queued and checked once they arrive, before they are sent (see
    /// `WriterOptions::defer_checks`), so no call waits longer than its own timeout for them.
    /// The call that starts the fetch waits [`TABLES_GRACE`] for it, or the whole fetch when
    /// the caller gave `get_signature_timeout_ms` (the reference's `create_item` waits that
    /// long and fails with DEADLINE_EXCEEDED).
    tables: TablesFetch,
}

impl PyTrajectoryWriter {
    /// Runs `f` on the writer: directly if the lock is free, otherwise without the GIL.
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut TrajectoryWriter) -> T + Send,
    ) -> T {
        locked(py, &self.inner, f)
    }

    /// Converts `values` (for `columns`) and appends them with `append`; returns None, or a
    /// tuple describing the rejected column (see `append`).
    fn append_with(
        &self,
        py: Python<'_>,
        columns: Vec<usize>,
        values: Vec<Bound<'_, PyAny>>,
        append: impl for<'a> FnOnce(
                &mut TrajectoryWriter,
                Vec<(usize, TensorView<'a>)>,
            ) -> Result<(), AppendError>
            + Send,
    ) -> PyResult<Option<Py<PyAppendError>>> {
        let arrays = values
            .iter()
            .map(|v| to_array(py, v))
            .collect::<PyResult<Vec<_>>>()?;
        let result = with_views(py, &self.inner, &arrays, |w, views| {
            append(w, columns.into_iter().zip(views.iter().copied()).collect())
        });
        match result {
            Ok(()) => Ok(None),
            Err(e) => append_error(py, e),
        }
    }

    /// Runs `f` (which creates items) on the writer. With `validate_items` and the
    /// server's tables not known yet, first starts fetching them and waits up to
    /// [`TABLES_GRACE`] (without the GIL); items created before they arrive are checked later.
    fn with_table<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut TrajectoryWriter) -> reverb_client::Result<T> + Send,
    ) -> PyResult<T> {
        self.tables.before_items(py, &self.inner)?;
        self.with(py, f).py()
    }

    /// Creates an item of `columns` in `table`, waiting without the GIL while the in-flight
    /// window is full.
    fn create_item_with(
        &self,
        py: Python<'_>,
        table: &str,
        priority: f64,
        columns: &[ItemColumn],
    ) -> PyResult<u64> {
        let now = Some(Instant::now());
        let (key, sent) = self.with_table(py, |w| w.create_item(table, priority, columns, now))?;
        if !sent {
            self.tables
                .wait_locked(py, &self.inner, None, "create_item", |w, until| {
                    w.send_ready(until)
                })?;
        }
        Ok(key)
    }
}

#[pymethods]
impl PyTrajectoryWriter {
    #[new]
    #[pyo3(signature = (client, *, num_keep_alive_refs, max_chunk_length=None, max_in_flight_items=1024, delta_encode=false, reconnect_timeout=60.0, num_envs=None, validate_items=false, signature_timeout_ms=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        client: &PyClient,
        num_keep_alive_refs: usize,
        max_chunk_length: Option<usize>,
        max_in_flight_items: usize,
        delta_encode: bool,
        reconnect_timeout: f64,
        num_envs: Option<usize>,
        validate_items: bool,
        signature_timeout_ms: Option<u64>,
    ) -> PyResult<Self> {
        if !(reconnect_timeout.is_finite() && reconnect_timeout >= 0.0) {
            return Err(PyValueError::new_err(
                "reconnect_timeout must be a number of seconds >= 0",
            ));
        }
        let options = WriterOptions {
            num_keep_alive_refs,
            max_chunk_length,
            max_in_flight_items,
            delta_encode,
            reconnect_timeout: Duration::from_secs_f64(reconnect_timeout),
            validate_items,
            defer_checks: true,
        };
        let client = client.fresh(py);
        let writer = match num_envs {
            None => TrajectoryWriter::new(client, options),
            Some(n) => TrajectoryWriter::with_envs(client, options, n),
        }
        .py()?;
        Ok(Self {
            inner: Arc::new(Mutex::new(writer)),
            tables: TablesFetch::new(
                signature_timeout_ms.map_or(TABLES_TIMEOUT, Duration::from_millis),
                // (The fetch ends by its own timeout; the margin lets its answer arrive.)
                signature_timeout_ms.map_or(TABLES_GRACE, |ms| {
                    Duration::from_millis(ms) + Duration::from_secs(1)
                }),
            ),
        })
    }

    /// Appends `values[i]` to column `columns[i]`. Returns None, or an `AppendError` naming
    /// the column that was rejected and why.
    #[pyo3(signature = (columns, values, partial=false))]
    fn append(
        &self,
        py: Python<'_>,
        columns: Vec<usize>,
        values: Vec<Bound<'_, PyAny>>,
        partial: bool,
    ) -> PyResult<Option<Py<PyAppendError>>> {
        self.append_with(py, columns, values, |w, v| w.append(v, partial))
    }

    /// Appends `step`, flattened by `columns` (see `StepColumns`). Returns `(error, grown)`:
    /// None or an `AppendError` naming the column that was rejected and why, and, when the
    /// step brought columns new to the history, the column of every leaf of the step. With
    /// `width` (the legacy writer's), a step of another number of leaves is refused
    /// (ValueError, the reference's message) and nothing of it is appended.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (step, columns, partial, width=None))]
    fn append_step(
        &self,
        py: Python<'_>,
        step: &Bound<'_, PyAny>,
        columns: &Bound<'_, PyStepColumns>,
        partial: bool,
        width: Option<usize>,
    ) -> PyResult<(Option<Py<PyAppendError>>, Option<Vec<usize>>)> {
        let flat = PyStepColumns::borrowed(columns).flat(step, width)?;
        let Flat {
            columns: leaf_columns,
            values,
            new,
            grown,
        } = flat;
        let appended = self.append_with(py, leaf_columns, values, |w, v| w.append(v, partial));
        match appended {
            Ok(result) => Ok((result, grown)),
            Err(e) => {
                // Nothing was appended: the step's new columns stay out of the history.
                PyStepColumns::borrowed(columns).forget_columns(&new);
                Err(e)
            }
        }
    }

    /// Appends N full steps at once; every value has a leading dimension N.
    fn append_steps(
        &self,
        py: Python<'_>,
        columns: Vec<usize>,
        values: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyAppendError>>> {
        self.append_with(py, columns, values, |w, v| w.append_steps(v).map(|_| ()))
    }

    /// Creates an item; `columns` is a list of `(refs, squeeze)` with refs `(column, step)`.
    fn create_item(
        &self,
        py: Python<'_>,
        table: String,
        priority: f64,
        columns: Vec<(Vec<(usize, u64)>, bool)>,
    ) -> PyResult<u64> {
        let columns: Vec<ItemColumn> = columns
            .into_iter()
            .map(|(refs, squeeze)| ItemColumn { refs, squeeze })
            .collect();
        self.create_item_with(py, &table, priority, &columns)
    }

    /// Creates an item from `trajectory`, a nest of `owner`'s `TrajectoryColumn`s in dicts,
    /// lists and tuples; returns None (and creates nothing) for anything else, which the
    /// caller checks in Python to say what is wrong.
    fn create_item_of_columns(
        &self,
        py: Python<'_>,
        table: String,
        priority: f64,
        trajectory: &Bound<'_, PyAny>,
        owner: &Bound<'_, PyAny>,
    ) -> PyResult<Option<u64>> {
        let Some(leaves) = column_leaves(trajectory)? else {
            return Ok(None);
        };
        if leaves.is_empty() || leaves.iter().any(|c| !c.get().is_of(owner)) {
            return Ok(None);
        }
        let columns: Vec<ItemColumn> = leaves
            .iter()
            .map(|c| ItemColumn {
                refs: c.get().cells.clone(),
                squeeze: c.get().squeeze,
            })
            .collect();
        self.create_item_with(py, &table, priority, &columns)
            .map(Some)
    }

    /// Creates an item of the episode's newest `num_steps` full steps of each of `columns`
    /// (unsqueezed): the legacy writer's items, without a Python list of cells per item.
    fn create_item_of_last(
        &self,
        py: Python<'_>,
        table: String,
        priority: f64,
        columns: Vec<usize>,
        num_steps: u64,
    ) -> PyResult<u64> {
        let now = Some(Instant::now());
        let (key, sent) = self.with_table(py, |w| {
            if num_steps == 0 || num_steps > w.episode_steps() {
                return Err(ClientError::invalid(format!(
                    "num_steps ({num_steps}) must be within 1 and the episode's {} steps",
                    w.episode_steps()
                )));
            }
            let end = w.episode_start() + w.episode_steps();
            let first = end - num_steps;
            let columns: Vec<ItemColumn> = columns
                .iter()
                .map(|&column| ItemColumn {
                    refs: (first..end).map(|step| (column, step)).collect(),
                    squeeze: false,
                })
                .collect();
            w.create_item(&table, priority, &columns, now)
        })?;
        if !sent {
            self.tables
                .wait_locked(py, &self.inner, None, "create_item", |w, until| {
                    w.send_ready(until)
                })?;
        }
        Ok(key)
    }

    /// Sends everything queued and waits until at most `block_until_num_items` are unconfirmed.
    #[pyo3(signature = (block_until_num_items=0, timeout_ms=None))]
    fn flush(
        &self,
        py: Python<'_>,
        block_until_num_items: u64,
        timeout_ms: Option<i64>,
    ) -> PyResult<()> {
        let deadline = deadline_ms(timeout_ms)?;
        self.tables
            .wait_locked(py, &self.inner, deadline, "flush", |w, until| {
                w.flush(block_until_num_items, until)
            })
    }

    /// Ends the episode (see `TrajectoryWriter::end_episode`), then waits until every item is
    /// confirmed; on a timeout the new episode has begun all the same.
    #[pyo3(signature = (clear_buffers=true, timeout_ms=None))]
    fn end_episode(
        &self,
        py: Python<'_>,
        clear_buffers: bool,
        timeout_ms: Option<i64>,
    ) -> PyResult<()> {
        let deadline = deadline_ms(timeout_ms)?;
        self.with(py, |w| w.end_episode(clear_buffers));
        self.tables
            .wait_locked(py, &self.inner, deadline, "end_episode", |w, until| {
                w.flush(0, until)
            })
    }

    /// Whether the insert stream has failed for good.
    #[getter]
    fn failed(&self, py: Python<'_>) -> bool {
        self.with(py, |w| w.failed())
    }

    /// Stops at once, cancelling whatever the server has not stored yet.
    fn abort(&self, py: Python<'_>) {
        py.detach(|| self.inner.lock().unwrap().abort());
    }

    /// Stops the writer's stream (items waiting for the server's tables get a second for
    /// them, as ready items get one to be sent).
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            let mut w = self.inner.lock().unwrap();
            if w.awaiting_tables() {
                let until = Instant::now() + Duration::from_secs(1);
                self.tables.last_chance(&mut *w, until);
            }
            w.close();
        });
    }

    /// Overrides keep-alive and chunk length of one column (a field, in every env, of a
    /// vectorised writer).
    fn configure(
        &self,
        py: Python<'_>,
        column: usize,
        num_keep_alive_refs: usize,
        max_chunk_length: Option<usize>,
    ) -> PyResult<()> {
        self.with(py, |w| {
            w.configure(column, num_keep_alive_refs, max_chunk_length)
        })
        .py()
    }

    /// Full steps appended in this episode.
    #[getter]
    fn episode_steps(&self, py: Python<'_>) -> u64 {
        self.with(py, |w| w.episode_steps())
    }

    /// Writer-wide index of the episode's first step (cells are addressed by writer-wide step).
    #[getter]
    fn episode_start(&self, py: Python<'_>) -> u64 {
        self.with(py, |w| w.episode_start())
    }

    /// Whether a partial step is open.
    #[getter]
    fn step_is_open(&self, py: Python<'_>) -> bool {
        self.with(py, |w| w.step_is_open())
    }

    /// `(dtype, shape)` of a column's rows (a field's, for vectorised writers), or None before
    /// its first value.
    fn column_spec(&self, py: Python<'_>, column: usize) -> Option<(i32, Vec<i64>)> {
        self.with(py, |w| w.column_spec(column))
    }

    /// Which steps of a column are still referenceable.
    fn alive(&self, py: Python<'_>, column: usize, steps: Vec<u64>) -> Vec<bool> {
        self.with(py, |w| w.alive(column, &steps))
    }

    /// The row of a cell as `(dtype, shape, uint8 array)`, or None when expired.
    fn read_cell<'py>(
        &self,
        py: Python<'py>,
        column: usize,
        step: u64,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        match self.with(py, |w| w.read_cell(column, step)).py()? {
            Some(t) => Ok(Some(column_out(py, t)?)),
            None => Ok(None),
        }
    }

    /// Items created and not yet confirmed.
    fn unconfirmed(&self, py: Python<'_>) -> u64 {
        self.with(py, |w| w.unconfirmed())
    }

    /// Vectorised writers: appends one step to every env; `values[i]` (field `fields[i]`)
    /// has a leading dimension of num_envs. Returns None or an `AppendError` as `append`
    /// (naming the field).
    fn append_envs(
        &self,
        py: Python<'_>,
        fields: Vec<usize>,
        values: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyAppendError>>> {
        self.append_with(py, fields, values, |w, v| w.append_envs(v))
    }

    /// Vectorised writers: steps of each env's episode so far.
    fn env_steps(&self, py: Python<'_>) -> Vec<u64> {
        self.with(py, |w| w.env_steps())
    }

    /// Vectorised writers: writer-wide step of each env's first episode step.
    fn env_starts(&self, py: Python<'_>) -> Vec<u64> {
        self.with(py, |w| w.env_starts())
    }

    /// Vectorised writers: ends the episodes of `envs` (does not wait).
    fn end_envs(&self, py: Python<'_>, envs: Vec<usize>, clear_buffers: bool) -> PyResult<()> {
        self.with(py, |w| w.end_envs(&envs, clear_buffers)).py()
    }

    /// Vectorised writers: the cells of `field` at `steps` (an int, a `(start, stop, step)`
    /// tuple or a list of ints) of env `env`'s episode, as `(dtype, shape, uint8 array)` or
    /// None for expired ones; IndexError when `steps` is out of range there.
    fn env_cells<'py>(
        &self,
        py: Python<'py>,
        field: usize,
        env: usize,
        steps: Bound<'_, PyAny>,
    ) -> PyResult<Vec<Option<Bound<'py, PyTuple>>>> {
        let steps = steps_of(&steps)?;
        let cells = self
            .with(py, |w| w.env_cells(field, env, &steps))
            .py()?
            .map_err(PyIndexError::new_err)?;
        cells
            .into_iter()
            .map(|c| c.map(|t| column_out(py, t)).transpose())
            .collect()
    }

    /// Vectorised writers: one item per env of `envs`; `columns` are `(field, steps,
    /// squeeze)` with steps an int, a `(start, stop, step)` tuple, or a list of ints.
    fn create_env_items(
        &self,
        py: Python<'_>,
        table: String,
        priorities: Vec<f64>,
        envs: Vec<usize>,
        columns: Vec<(usize, Bound<'_, PyAny>, bool)>,
    ) -> PyResult<()> {
        let columns = columns
            .into_iter()
            .map(|(field, steps, squeeze)| Ok((field, steps_of(&steps)?, squeeze)))
            .collect::<PyResult<Vec<_>>>()?;
        let now = Some(Instant::now());
        let sent = self.with_table(py, |w| {
            w.create_env_items(&table, &priorities, &envs, &columns, now)
        })?;
        if !sent {
            self.tables
                .wait_locked(py, &self.inner, None, "create_item", |w, until| {
                    w.send_ready(until)
                })?;
        }
        Ok(())
    }
}
