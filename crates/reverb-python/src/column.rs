//! `TrajectoryColumn` and the cell references (`CellRef`) it is made of, native: actors slice
//! history and create an item on every step. A cell is `(column, writer-wide step)` of one
//! trajectory writer; columns read their cells, dtype and shape from the native writer
//! directly.

use crate::blocking::locked;
use crate::layout::{plain_dict, MAX_DEPTH};
use crate::numpy::{array_out, numpy_dtype, numpy_integer};
use pyo3::exceptions::{PyIndexError, PyOverflowError, PyRuntimeError, PyValueError};
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyList, PySlice, PyTuple};
use pyo3::PyTraverseError;
use reverb_client::tensor::{encode_strings, DT_STRING};
use reverb_client::writer::TrajectoryWriter;
use reverb_client::Tensor;
use std::sync::{Arc, Mutex};

/// A native trajectory writer shared by its Python object and the columns of its history.
pub(crate) type SharedWriter = Arc<Mutex<TrajectoryWriter>>;

/// Cells of one column: `(column, writer-wide step)`.
pub(crate) type Cells = Vec<(usize, u64)>;

/// The writer cells belong to: the Python `TrajectoryWriter` (items are created through it,
/// and only from its own cells) and the native writer they are read from.
pub(crate) struct Origin {
    pub(crate) owner: Py<PyAny>,
    pub(crate) writer: SharedWriter,
}

impl Origin {
    fn clone_ref(&self, py: Python<'_>) -> Self {
        Self {
            owner: self.owner.clone_ref(py),
            writer: self.writer.clone(),
        }
    }

    /// `(TF dtype, row shape)` of a column; ValueError before its first value.
    fn spec(
        &self,
        py: Python<'_>,
        column: usize,
        path: Option<&Py<PyAny>>,
    ) -> PyResult<(i32, Vec<i64>)> {
        locked(py, &self.writer, |w| w.column_spec(column)).ok_or_else(|| {
            PyValueError::new_err(format!("Column {} has no data yet", name(py, column, path)))
        })
    }

    /// The cells' rows; RuntimeError naming the first that has expired.
    fn read(
        &self,
        py: Python<'_>,
        cells: &[(usize, u64)],
        path: Option<&Py<PyAny>>,
    ) -> PyResult<Vec<Tensor>> {
        let rows = locked(py, &self.writer, |w| {
            cells
                .iter()
                .map(|&(c, s)| w.read_cell(c, s))
                .collect::<reverb_client::Result<Vec<_>>>()
        })
        .map_err(crate::errors::client_error)?;
        rows.into_iter()
            .zip(cells)
            .map(|(row, &(column, step))| {
                row.ok_or_else(|| {
                    PyRuntimeError::new_err(format!(
                        "Cannot read step {step} of column {}: it has expired (increase \
                         num_keep_alive_refs)",
                        name(py, column, path)
                    ))
                })
            })
            .collect()
    }
}

/// A column as errors name it: its path when known, else its index.
fn name(py: Python<'_>, column: usize, path: Option<&Py<PyAny>>) -> String {
    path.and_then(|p| p.bind(py).str().ok())
        .map_or_else(|| format!("#{column}"), |p| p.to_string())
}

/// Rows of one dtype and shape stacked along a new leading dimension.
fn stack(rows: Vec<Tensor>) -> PyResult<Tensor> {
    let Some(first) = rows.first() else {
        return Err(PyValueError::new_err("A column without cells has no data"));
    };
    let (dtype, row) = (first.dtype, first.shape.clone());
    if let Some(other) = rows.iter().find(|r| r.dtype != dtype || r.shape != row) {
        return Err(PyValueError::new_err(format!(
            "The column's cells differ in dtype or shape ({:?} {:?} and {:?} {:?}): they \
             cannot be stacked",
            dtype, row, other.dtype, other.shape
        )));
    }
    let shape: Vec<i64> = std::iter::once(rows.len() as i64).chain(row).collect();
    let data = if dtype == DT_STRING {
        let elements = rows
            .iter()
            .map(Tensor::strings)
            .collect::<reverb_client::Result<Vec<_>>>()
            .map_err(crate::errors::client_error)?;
        encode_strings(elements.into_iter().flatten())
    } else {
        rows.into_iter().flat_map(|r| r.data).collect()
    };
    Ok(Tensor { dtype, shape, data })
}

/// One cell of a writer's history: what iterating a history column or a `TrajectoryColumn`
/// gives (the reference's `WeakCellRef`s).
#[pyclass(name = "CellRef", module = "reverb.trajectory_writer", frozen)]
pub(crate) struct PyCellRef {
    origin: Origin,
    column: usize,
    step: u64,
    path: Option<Py<PyAny>>,
}

#[pymethods]
impl PyCellRef {
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.origin.owner)?;
        visit.call(&self.path)
    }

    /// Whether the cell can no longer be referenced.
    #[getter]
    fn expired(&self, py: Python<'_>) -> bool {
        let (column, step) = (self.column, self.step);
        !locked(py, &self.origin.writer, |w| w.alive(column, &[step])[0])
    }

    /// The cell's shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.origin.spec(py, self.column, self.path.as_ref())?.1)
    }

    /// The cell's numpy dtype.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        numpy_dtype(py, self.origin.spec(py, self.column, self.path.as_ref())?.0)
    }

    /// The cell's value; RuntimeError if it has expired.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mut rows = self
            .origin
            .read(py, &[(self.column, self.step)], self.path.as_ref())?;
        array_out(py, rows.remove(0))
    }

    fn __repr__(&self) -> String {
        format!("CellRef(column={}, step={})", self.column, self.step)
    }

    /// References to one cell of one writer are equal.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.downcast::<Self>().is_ok_and(|other| {
            let other = other.get();
            self.origin.owner.is(&other.origin.owner)
                && (self.column, self.step) == (other.column, other.step)
        })
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (self.origin.owner.as_ptr() as usize, self.column, self.step).hash(&mut hasher);
        hasher.finish()
    }
}

/// References to `cells` of `origin` (with the column's `path`), as an iterator.
pub(crate) fn cell_refs<'py>(
    py: Python<'py>,
    origin: &Origin,
    cells: impl Iterator<Item = (usize, u64)>,
    path: Option<&Py<PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let refs = cells
        .map(|(column, step)| {
            Bound::new(
                py,
                PyCellRef {
                    origin: origin.clone_ref(py),
                    column,
                    step,
                    path: path.map(|p| p.clone_ref(py)),
                },
            )
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, refs)?.try_iter().map(Bound::into_any)
}

/// Positions `index` (an int, a slice or a list of ints, as a Python list takes them)
/// selects in a sequence of `len`; the int case is flagged (it squeezes). IndexError names
/// `what` for an int out of range.
pub(crate) fn select(
    index: &Bound<'_, PyAny>,
    len: usize,
    what: &str,
) -> PyResult<(Vec<usize>, bool)> {
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
    /// The writer whose cells these are (None: no cells).
    origin: Option<Origin>,
    pub(crate) cells: Cells,
    pub(crate) squeeze: bool,
    path: Option<Py<PyAny>>,
}

impl PyTrajectoryColumn {
    /// A column of `cells` of `origin`.
    pub(crate) fn of(
        py: Python<'_>,
        origin: &Origin,
        cells: Cells,
        squeeze: bool,
        path: Option<&Py<PyAny>>,
    ) -> Self {
        Self {
            origin: Some(origin.clone_ref(py)),
            cells,
            squeeze,
            path: path.map(|p| p.clone_ref(py)),
        }
    }

    /// Whether the column's cells are `owner`'s.
    pub(crate) fn is_of(&self, owner: &Bound<'_, PyAny>) -> bool {
        self.origin.as_ref().is_some_and(|o| o.owner.is(owner))
    }

    fn origin(&self) -> PyResult<&Origin> {
        self.origin
            .as_ref()
            .ok_or_else(|| PyIndexError::new_err("The column has no cells"))
    }

    /// `(TF dtype, row shape)` of the column's cells.
    fn spec(&self, py: Python<'_>) -> PyResult<(i32, Vec<i64>)> {
        let Some(&(column, _)) = self.cells.first() else {
            return Err(PyIndexError::new_err("The column has no cells"));
        };
        self.origin()?.spec(py, column, self.path.as_ref())
    }
}

#[pymethods]
impl PyTrajectoryColumn {
    /// A column of `data_references` (cell references from iterating a history column).
    #[new]
    #[pyo3(signature = (data_references, *, squeeze=false, path=None))]
    fn new(
        py: Python<'_>,
        data_references: &Bound<'_, PyAny>,
        squeeze: bool,
        path: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let refs = data_references.try_iter()?.collect::<PyResult<Vec<_>>>()?;
        if refs.iter().any(|r| r.is_none()) {
            let at = match &path {
                Some(p) => format!(" (column {})", p.bind(py).str()?),
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
        let mut origin: Option<Origin> = None;
        let mut cells = Vec::with_capacity(refs.len());
        for r in &refs {
            let cell = r.downcast::<PyCellRef>().map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err(format!(
                    "A TrajectoryColumn is made of cell references from a writer's history, \
                     got {}",
                    r.repr().map_or_else(|_| "?".to_string(), |r| r.to_string())
                ))
            })?;
            let cell = cell.get();
            match &origin {
                Some(o) if !o.owner.is(&cell.origin.owner) => {
                    return Err(PyValueError::new_err(
                        "All references of a TrajectoryColumn must come from one writer",
                    ))
                }
                Some(_) => {}
                None => origin = Some(cell.origin.clone_ref(py)),
            }
            cells.push((cell.column, cell.step));
        }
        Ok(Self {
            origin,
            cells,
            squeeze,
            path,
        })
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(origin) = &self.origin {
            visit.call(&origin.owner)?;
        }
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
        match &self.origin {
            Some(origin) => cell_refs(py, origin, self.cells.iter().copied(), self.path.as_ref()),
            None => PyList::empty(py).try_iter().map(Bound::into_any),
        }
    }

    /// An int gives a squeezed column of one cell; a slice or a list of ints a batched one.
    fn __getitem__(&self, py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (positions, squeeze) = select(index, self.cells.len(), "Column")?;
        Ok(Self {
            origin: self.origin.as_ref().map(|o| o.clone_ref(py)),
            cells: positions.into_iter().map(|i| self.cells[i]).collect(),
            squeeze,
            path: self.path.as_ref().map(|p| p.clone_ref(py)),
        })
    }

    /// The writer whose cells these are (None without cells).
    #[getter]
    fn _writer(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.origin.as_ref().map(|o| o.owner.clone_ref(py))
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
        let row = if self.cells.is_empty() {
            Vec::new()
        } else {
            self.spec(py)?.1
        };
        if self.squeeze {
            return PyTuple::new(py, row);
        }
        let shape: Vec<i64> = std::iter::once(self.cells.len() as i64)
            .chain(row)
            .collect();
        PyTuple::new(py, shape)
    }

    /// The numpy dtype of the cells.
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        numpy_dtype(py, self.spec(py)?.0)
    }

    /// The column's data (squeezed: the one cell); RuntimeError if a referenced cell has
    /// expired.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(origin) = &self.origin else {
            return Err(PyValueError::new_err("A column without cells has no data"));
        };
        let mut rows = origin.read(py, &self.cells, self.path.as_ref())?;
        if self.squeeze {
            return array_out(py, rows.remove(0));
        }
        array_out(py, stack(rows)?)
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

/// The stacked rows of `cells` of `origin` (expired cells skipped), or an empty array of the
/// column's rows when none is live.
pub(crate) fn live_numpy<'py>(
    py: Python<'py>,
    origin: &Origin,
    column: usize,
    steps: std::ops::Range<u64>,
    path: &Py<PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let steps: Vec<u64> = steps.collect();
    let alive = locked(py, &origin.writer, |w| w.alive(column, &steps));
    let cells: Cells = steps
        .iter()
        .zip(alive)
        .filter(|(_, alive)| *alive)
        .map(|(&s, _)| (column, s))
        .collect();
    if cells.is_empty() {
        let (dtype, row) = origin.spec(py, column, Some(path))?;
        let shape: Vec<i64> = std::iter::once(0).chain(row).collect();
        let data = if dtype == DT_STRING {
            encode_strings(std::iter::empty())
        } else {
            Vec::new()
        };
        return array_out(py, Tensor { dtype, shape, data });
    }
    let rows = origin.read(py, &cells, Some(path))?;
    array_out(py, stack(rows)?)
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
