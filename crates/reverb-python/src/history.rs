//! `TrajectoryWriter.history` and `TrajectoryColumn` in native code: actors index the history
//! and create an item on every step, so both are native objects (a slice of a column's
//! history is one call, and `create_item` reads the columns' cells without a Python list).
//!
//! Cells are `(column, step)` with a writer-wide step. What needs Python (`numpy()`, cell
//! references, the column's dtype and shape) calls back into `reverb.trajectory_writer`.

use crate::layout::{plain_dict, MAX_DEPTH};
use crate::numpy::numpy_integer;
use crate::writer::{locked, PyTrajectoryWriter};
use pyo3::exceptions::{PyIndexError, PyOverflowError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PySlice, PyTuple};
use pyo3::PyTraverseError;

/// Cells of one column: `(column, writer-wide step)`.
pub(crate) type Cells = Vec<(usize, u64)>;

/// A helper of `reverb.trajectory_writer` (the Python half of these classes).
fn helper<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("reverb.trajectory_writer")?.getattr(name)
}

/// `_CellRef(writer, column, step)` for each cell, as an iterator.
fn cell_refs<'py>(
    py: Python<'py>,
    owner: &Py<PyAny>,
    cells: impl Iterator<Item = (usize, u64)>,
) -> PyResult<Bound<'py, PyAny>> {
    let cell_ref = helper(py, "_CellRef")?;
    let refs = cells
        .map(|(c, s)| cell_ref.call1((owner, c, s)))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, refs)?.try_iter().map(Bound::into_any)
}

/// Positions `index` (an int, a slice or a list of ints, as a Python list takes them)
/// selects in a sequence of `len`; the int case is flagged (it squeezes). IndexError names
/// `what` for an int out of range.
fn select(index: &Bound<'_, PyAny>, len: usize, what: &str) -> PyResult<(Vec<usize>, bool)> {
    let one = |i: isize| -> PyResult<usize> {
        let at = if i < 0 { i + len as isize } else { i };
        if at < 0 || at >= len as isize {
            return Err(PyIndexError::new_err(format!(
                "{what} index {i} out of range for {len} steps"
            )));
        }
        Ok(at as usize)
    };
    if let Ok(slice) = index.downcast::<PySlice>() {
        let s = slice.indices(len as isize)?;
        let positions = (0..s.slicelength)
            .map(|k| (s.start + k as isize * s.step) as usize)
            .collect();
        return Ok((positions, false));
    }
    // An int beyond isize is out of range all the same.
    let int = |i: &Bound<'_, PyAny>| -> PyResult<isize> {
        i.extract::<isize>().map_err(|e| {
            if e.is_instance_of::<PyOverflowError>(i.py()) {
                PyIndexError::new_err(format!("{what} index {i} out of range for {len} steps"))
            } else {
                e
            }
        })
    };
    if index.is_instance_of::<PyInt>() || index.is_instance(numpy_integer(index.py())?)? {
        return Ok((vec![one(int(index)?)?], true));
    }
    // (List elements as the Python class took them: through int().)
    let to_int = index.py().get_type::<PyInt>();
    let positions = index
        .try_iter()?
        .map(|i| one(int(&to_int.call1((i?,))?)?))
        .collect::<PyResult<_>>()?;
    Ok((positions, false))
}

/// A column of an item: references to cells of one writer's history, optionally squeezed
/// (exactly one cell, no leading dimension). Made by indexing `writer.history`.
#[pyclass(name = "TrajectoryColumn", module = "reverb.trajectory_writer", frozen)]
pub(crate) struct PyTrajectoryColumn {
    /// The Python `TrajectoryWriter` whose cells these are (None: no cells).
    owner: Option<Py<PyAny>>,
    pub(crate) cells: Cells,
    pub(crate) squeeze: bool,
    path: Option<Py<PyAny>>,
}

impl PyTrajectoryColumn {
    /// Whether the column's cells are `owner`'s.
    pub(crate) fn is_of(&self, owner: &Bound<'_, PyAny>) -> bool {
        self.owner.as_ref().is_some_and(|o| o.is(owner))
    }

    fn owner<'py>(&self, py: Python<'py>) -> PyResult<&Bound<'py, PyAny>> {
        match &self.owner {
            Some(owner) => Ok(owner.bind(py)),
            None => Err(PyValueError::new_err("The column has no cells")),
        }
    }

    /// `(dtype, row shape)` of the column's cells.
    fn spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(&(column, _)) = self.cells.first() else {
            return Err(PyIndexError::new_err("The column has no cells"));
        };
        self.owner(py)?.call_method1("_spec", (column,))
    }
}

#[pymethods]
impl PyTrajectoryColumn {
    /// A column of `data_references` (cell references from iterating a history column).
    #[new]
    #[pyo3(signature = (data_references, *, squeeze=false, path=None))]
    fn new(
        data_references: &Bound<'_, PyAny>,
        squeeze: bool,
        path: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let refs = data_references.try_iter()?.collect::<PyResult<Vec<_>>>()?;
        if refs.iter().any(|r| r.is_none()) {
            let at = match &path {
                Some(p) => format!(" (column {})", p.bind(data_references.py()).str()?),
                None => String::new(),
            };
            return Err(PyValueError::new_err(format!(
                "TrajectoryColumns cannot be created from None references: the column has no \
                 data at some of the requested steps{at}"
            )));
        }
        if squeeze && refs.len() != 1 {
            return Err(PyValueError::new_err(format!(
                "Columns must contain exactly one data reference when squeeze is set, got {}",
                refs.len()
            )));
        }
        let mut owner: Option<Bound<'_, PyAny>> = None;
        let mut cells = Vec::with_capacity(refs.len());
        for r in &refs {
            let writer = r.get_item(0)?;
            match &owner {
                Some(o) if !o.is(&writer) => {
                    return Err(PyValueError::new_err(
                        "All references of a TrajectoryColumn must come from one writer",
                    ))
                }
                _ => owner = Some(writer),
            }
            cells.push((r.get_item(1)?.extract()?, r.get_item(2)?.extract()?));
        }
        Ok(Self {
            owner: owner.map(Bound::unbind),
            cells,
            squeeze,
            path,
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.owner)?;
        visit.call(&self.path)
    }

    /// Columns are immutable: a copy is the column itself.
    fn __copy__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf
    }

    fn __len__(&self) -> usize {
        self.cells.len()
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &self.owner {
            Some(owner) => cell_refs(py, owner, self.cells.iter().copied()),
            None => PyList::empty(py).try_iter().map(Bound::into_any),
        }
    }

    /// An int gives a squeezed column of one cell; a slice or a list of ints a batched one.
    fn __getitem__(&self, py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (positions, squeeze) = select(index, self.cells.len(), "Column")?;
        Ok(Self {
            owner: self.owner.as_ref().map(|o| o.clone_ref(py)),
            cells: positions.into_iter().map(|i| self.cells[i]).collect(),
            squeeze,
            path: self.path.as_ref().map(|p| p.clone_ref(py)),
        })
    }

    /// The writer whose cells these are (None without cells).
    #[getter]
    fn _writer(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.owner.as_ref().map(|o| o.clone_ref(py))
    }

    /// `[(column, writer-wide step)]`.
    #[getter]
    fn _cells(&self) -> Cells {
        self.cells.clone()
    }

    /// Whether the leading dimension is dropped.
    #[getter]
    fn is_squeezed(&self) -> bool {
        self.squeeze
    }

    /// `(len, *row_shape)`, or the row shape when squeezed.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let row: Vec<Bound<'py, PyAny>> = if self.cells.is_empty() {
            Vec::new()
        } else {
            self.spec(py)?
                .get_item(1)?
                .try_iter()?
                .collect::<PyResult<_>>()?
        };
        if self.squeeze {
            return PyTuple::new(py, row);
        }
        let mut shape = vec![self.cells.len().into_pyobject(py)?.into_any()];
        shape.extend(row);
        PyTuple::new(py, shape)
    }

    /// The numpy dtype of the cells.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.spec(py)?.get_item(0)
    }

    /// The column's data; RuntimeError if a referenced cell has expired.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        helper(py, "_column_numpy")?.call1((self.owner(py)?, self.cells.clone(), self.squeeze))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let path = match &self.path {
            Some(p) => p.bind(py).str()?.to_string(),
            None => "None".to_string(),
        };
        Ok(format!(
            "TrajectoryColumn(len={}, squeeze={}, path={path})",
            self.cells.len(),
            if self.squeeze { "True" } else { "False" }
        ))
    }
}

/// The cells of one column over the current episode; index it like a sequence (an int gives
/// a squeezed `TrajectoryColumn`, a slice or a list of ints a batched one).
#[pyclass(name = "ColumnHistory", module = "reverb.trajectory_writer", frozen)]
pub(crate) struct PyColumnHistory {
    /// The Python `TrajectoryWriter` (put into the columns made here).
    owner: Py<PyAny>,
    native: Py<PyTrajectoryWriter>,
    column: usize,
    path: Py<PyAny>,
}

impl PyColumnHistory {
    /// `(writer-wide step of the episode's first step, steps in the history)`.
    fn steps(&self, py: Python<'_>) -> (u64, usize) {
        locked(py, &self.native.get().inner, |w| {
            let open = u64::from(w.step_is_open());
            (w.episode_start(), (w.episode_steps() + open) as usize)
        })
    }
}

#[pymethods]
impl PyColumnHistory {
    #[new]
    fn new(
        owner: Py<PyAny>,
        native: Py<PyTrajectoryWriter>,
        column: usize,
        path: Py<PyAny>,
    ) -> Self {
        Self {
            owner,
            native,
            column,
            path,
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.owner)?;
        visit.call(&self.path)
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.steps(py).1
    }

    /// The writer column.
    #[getter]
    fn _column(&self) -> usize {
        self.column
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (start, len) = self.steps(py);
        let column = self.column;
        cell_refs(
            py,
            &self.owner,
            (start..start + len as u64).map(|s| (column, s)),
        )
    }

    fn __getitem__(
        &self,
        py: Python<'_>,
        index: &Bound<'_, PyAny>,
    ) -> PyResult<PyTrajectoryColumn> {
        let (start, len) = self.steps(py);
        let (positions, squeeze) = select(index, len, "History")?;
        let column = self.column;
        Ok(PyTrajectoryColumn {
            owner: Some(self.owner.clone_ref(py)),
            cells: positions
                .into_iter()
                .map(|i| (column, start + i as u64))
                .collect(),
            squeeze,
            path: Some(self.path.clone_ref(py)),
        })
    }

    /// Every live cell of the column, stacked (expired cells are skipped).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        helper(py, "_history_numpy")?.call1((&self.owner, self.column))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let path = self.path.bind(py).str()?;
        Ok(format!(
            "ColumnHistory(path={path}, len={})",
            self.steps(py).1
        ))
    }
}

/// The `TrajectoryColumn` leaves of `trajectory` (a nest of dicts, lists and tuples) in
/// `tf.nest` order, or None when it holds anything else (another mapping, a leaf that is not
/// a column): the caller then takes the general path, which explains what is wrong.
pub(crate) fn column_leaves<'py>(
    trajectory: &Bound<'py, PyAny>,
) -> PyResult<Option<Vec<Bound<'py, PyTrajectoryColumn>>>> {
    fn walk<'py>(
        x: &Bound<'py, PyAny>,
        out: &mut Vec<Bound<'py, PyTrajectoryColumn>>,
        depth: usize,
    ) -> PyResult<bool> {
        if depth > MAX_DEPTH {
            // (A cyclic or absurdly deep nest: Python's flattening raises RecursionError.)
            return Ok(false);
        }
        if let Ok(column) = x.downcast::<PyTrajectoryColumn>() {
            out.push(column.clone());
        } else if let Some(dict) = plain_dict(x)? {
            let keys = dict.keys();
            if keys.sort().is_err() {
                return Ok(false);
            }
            for key in keys.iter() {
                match dict.get_item(&key)? {
                    Some(value) if walk(&value, out, depth + 1)? => {}
                    _ => return Ok(false),
                }
            }
        } else if let Ok(list) = x.downcast::<PyList>() {
            for value in list.iter() {
                if !walk(&value, out, depth + 1)? {
                    return Ok(false);
                }
            }
        } else if let Ok(tuple) = x.downcast::<PyTuple>() {
            for value in tuple.iter() {
                if !walk(&value, out, depth + 1)? {
                    return Ok(false);
                }
            }
        } else {
            return Ok(false);
        }
        Ok(true)
    }
    let mut out = Vec::new();
    Ok(walk(trajectory, &mut out, 0)?.then_some(out))
}
