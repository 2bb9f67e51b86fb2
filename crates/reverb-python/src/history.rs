//! `TrajectoryWriter.history` in native code: one `ColumnHistory` per written column, indexed
//! like a sequence of the current episode's cells into `TrajectoryColumn`s (`column`).

use crate::blocking::locked;
use crate::column::{cell_refs, live_numpy, select, Origin, PyTrajectoryColumn};
use crate::writer::PyTrajectoryWriter;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::PyTraverseError;

/// The cells of one column over the current episode; index it like a sequence (an int gives
/// a squeezed `TrajectoryColumn`, a slice or a list of ints a batched one).
#[pyclass(name = "ColumnHistory", module = "reverb.trajectory_writer", frozen)]
pub(crate) struct PyColumnHistory {
    origin: Origin,
    column: usize,
    path: Py<PyAny>,
}

impl PyColumnHistory {
    /// The writer-wide steps of the episode's cells (a partial step included).
    fn steps(&self, py: Python<'_>) -> std::ops::Range<u64> {
        locked(py, &self.origin.writer, |w| {
            let start = w.episode_start();
            start..start + w.episode_steps() + u64::from(w.step_is_open())
        })
    }
}

#[pymethods]
impl PyColumnHistory {
    /// The history of `column` (at `path`) of `native`, the native half of `owner`.
    #[new]
    fn new(
        owner: Py<PyAny>,
        native: PyRef<'_, PyTrajectoryWriter>,
        column: usize,
        path: Py<PyAny>,
    ) -> Self {
        Self {
            origin: Origin {
                owner,
                writer: native.inner.clone(),
            },
            column,
            path,
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.origin.owner)?;
        visit.call(&self.path)
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.steps(py).count()
    }

    /// The writer column.
    #[getter]
    fn _column(&self) -> usize {
        self.column
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let column = self.column;
        let cells = self.steps(py).map(|step| (column, step));
        cell_refs(py, &self.origin, cells, Some(&self.path))
    }

    fn __getitem__(
        &self,
        py: Python<'_>,
        index: &Bound<'_, PyAny>,
    ) -> PyResult<PyTrajectoryColumn> {
        let steps = self.steps(py);
        let (positions, squeeze) = select(index, steps.clone().count(), "History")?;
        let cells = positions
            .into_iter()
            .map(|i| (self.column, steps.start + i as u64))
            .collect();
        Ok(PyTrajectoryColumn::of(
            py,
            &self.origin,
            cells,
            squeeze,
            Some(&self.path),
        ))
    }

    /// Every live cell of the column, stacked (expired cells are skipped).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        live_numpy(py, &self.origin, self.column, self.steps(py), &self.path)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let path = self.path.bind(py).str()?;
        Ok(format!(
            "ColumnHistory(path={path}, len={})",
            self.steps(py).count()
        ))
    }
}
