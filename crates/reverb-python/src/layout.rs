//! How writers flatten steps. `StepColumns` (the trajectory writers'): every step's leaves
//! with the writer column of their paths, a step of the last structure in one native walk,
//! any other walked in full natively. `StepLayout` (the structured writer's, whose columns are
//! positions): the structure of the last step, so the next steps of that structure flatten
//! natively.
//!
//! Flattening follows `reverb._nest`'s (and `tf.nest`'s) order: dicts by sorted key, lists
//! and tuples (named tuples too) in order, anything else is a leaf.

use crate::numpy::is_plain_leaf;
use pyo3::exceptions::PyValueError;
use pyo3::gc::PyVisit;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple, PyType};
use pyo3::PyTraverseError;

/// Deepest nest walked natively; deeper (or cyclic) ones are left to Python.
pub(crate) const MAX_DEPTH: usize = 64;

/// `x` as a dict whose items can be read from its storage: a `dict`, `OrderedDict` or
/// `defaultdict` (other subclasses may override item access: Python reads those).
pub(crate) fn plain_dict<'a, 'py>(
    x: &'a Bound<'py, PyAny>,
) -> PyResult<Option<&'a Bound<'py, PyDict>>> {
    let Ok(dict) = x.downcast::<PyDict>() else {
        return Ok(None);
    };
    if x.is_exact_instance_of::<PyDict>() {
        return Ok(Some(dict));
    }
    static ORDERED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    static DEFAULT: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = x.py();
    let ty = x.get_type();
    let plain = ty.is(ORDERED.import(py, "collections", "OrderedDict")?)
        || ty.is(DEFAULT.import(py, "collections", "defaultdict")?);
    Ok(plain.then_some(dict))
}

/// `collections.abc.Mapping`.
fn mapping_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static MAPPING: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    MAPPING.import(py, "collections.abc", "Mapping")
}

/// One node of a step's structure.
enum Node {
    Leaf,
    /// Entries in sorted key order.
    Dict(Vec<(Py<PyAny>, Node)>),
    List(Vec<Node>),
    /// The exact tuple type (a named tuple's class, or `tuple`).
    Tuple(Py<PyType>, Vec<Node>),
}

impl Node {
    /// The structure of `x`, or None when it holds a mapping other than a plain dict (see
    /// [`plain_dict`]) or nests deeper than [`MAX_DEPTH`] (their flattening is left to
    /// Python).
    fn of(x: &Bound<'_, PyAny>, depth: usize) -> PyResult<Option<Node>> {
        if depth > MAX_DEPTH {
            return Ok(None);
        }
        let children = |items: Vec<Bound<'_, PyAny>>| -> PyResult<Option<Vec<Node>>> {
            items.iter().map(|c| Node::of(c, depth + 1)).collect()
        };
        Ok(if let Some(dict) = plain_dict(x)? {
            let keys = dict.keys();
            keys.sort()?;
            let mut entries = Vec::with_capacity(keys.len());
            for key in keys.iter() {
                let value = dict.get_item(&key)?.expect("a key of the dict");
                match Node::of(&value, depth + 1)? {
                    Some(node) => entries.push((key.unbind(), node)),
                    None => return Ok(None),
                }
            }
            Some(Node::Dict(entries))
        } else if let Ok(list) = x.downcast::<PyList>() {
            children(list.iter().collect())?.map(Node::List)
        } else if let Ok(tuple) = x.downcast::<PyTuple>() {
            children(tuple.iter().collect())?.map(|c| Node::Tuple(x.get_type().unbind(), c))
        } else if x.is_instance(mapping_type(x.py())?)? {
            None
        } else {
            Some(Node::Leaf)
        })
    }

    /// Appends the leaves of `x` to `out` if `x` has this structure and every leaf is plain
    /// (see [`is_plain_leaf`]); false otherwise.
    fn flatten<'py>(
        &self,
        x: &Bound<'py, PyAny>,
        out: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<bool> {
        let py = x.py();
        match self {
            Node::Leaf => {
                if !is_plain_leaf(py, x)? {
                    return Ok(false);
                }
                out.push(x.clone());
            }
            Node::Dict(entries) => {
                let Some(dict) = plain_dict(x)? else {
                    return Ok(false);
                };
                if dict.len() != entries.len() {
                    return Ok(false);
                }
                for (key, node) in entries {
                    match dict.get_item(key)? {
                        Some(value) if node.flatten(&value, out)? => {}
                        _ => return Ok(false),
                    }
                }
            }
            Node::List(nodes) => match x.downcast::<PyList>() {
                Ok(list) if list.len() == nodes.len() => {
                    return Node::flatten_all(nodes, list.iter(), out)
                }
                _ => return Ok(false),
            },
            Node::Tuple(ty, nodes) => match x.downcast::<PyTuple>() {
                Ok(tuple) if x.get_type().is(ty) && tuple.len() == nodes.len() => {
                    return Node::flatten_all(nodes, tuple.iter(), out)
                }
                _ => return Ok(false),
            },
        }
        Ok(true)
    }

    /// [`Node::flatten`] of each of `values` by the node at its position.
    fn flatten_all<'py>(
        nodes: &[Node],
        values: impl Iterator<Item = Bound<'py, PyAny>>,
        out: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<bool> {
        for (value, node) in values.zip(nodes) {
            if !node.flatten(&value, out)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self {
            Node::Leaf => Ok(()),
            Node::Dict(entries) => entries.iter().try_for_each(|(key, node)| {
                visit.call(key)?;
                node.visit(visit)
            }),
            Node::List(nodes) => nodes.iter().try_for_each(|n| n.visit(visit)),
            Node::Tuple(ty, nodes) => {
                visit.call(ty)?;
                nodes.iter().try_for_each(|n| n.visit(visit))
            }
        }
    }
}

/// The structure of a step and the writer column of each of its leaves (in flattening
/// order). `StepLayout.of(step, columns)` makes one; `flatten(step)` gives the leaves of a
/// step of that structure.
#[pyclass(name = "StepLayout", module = "reverb._native", frozen)]
pub(crate) struct PyStepLayout {
    root: Node,
    /// The column of each leaf.
    pub(crate) columns: Vec<usize>,
}

impl PyStepLayout {
    /// The leaves of `data` in flattening order, or None when `data` does not have this
    /// structure or a leaf is not plain (None, a mapping that is not a dict, any object
    /// numpy would have to convert).
    pub(crate) fn leaves<'py>(
        &self,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        let mut out = Vec::with_capacity(self.columns.len());
        Ok(self.root.flatten(data, &mut out)?.then_some(out))
    }
}

#[pymethods]
impl PyStepLayout {
    /// The layout of `step` whose leaves go to `columns`; None when `step` holds a mapping
    /// that is not a dict, or `columns` has another number of leaves.
    #[staticmethod]
    fn of(step: &Bound<'_, PyAny>, columns: Vec<usize>) -> PyResult<Option<Self>> {
        let Some(root) = Node::of(step, 0)? else {
            return Ok(None);
        };
        Ok((root.count() == columns.len()).then_some(Self { root, columns }))
    }

    /// The leaves of `step` in flattening order, or None when it has another structure or
    /// a leaf that is not a plain value (see `leaves`).
    fn flatten<'py>(&self, step: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyList>>> {
        match self.leaves(step)? {
            Some(leaves) => Ok(Some(PyList::new(step.py(), leaves)?)),
            None => Ok(None),
        }
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.root.visit(&visit)
    }
}

impl Node {
    /// The number of leaves.
    fn count(&self) -> usize {
        match self {
            Node::Leaf => 1,
            Node::Dict(entries) => entries.iter().map(|(_, n)| n.count()).sum(),
            Node::List(nodes) | Node::Tuple(_, nodes) => nodes.iter().map(Node::count).sum(),
        }
    }
}

/// How deep the general walk of [`PyStepColumns::flatten`] goes before it gives up on a nest
/// (a cyclic one: Python's flattening raises RecursionError too).
const MAX_WALK_DEPTH: usize = 500;

/// The writer columns of a trajectory writer's steps: one per leaf path (a tuple of dict
/// keys, named-tuple field names and sequence indices, as `tf.nest` paths), numbered as paths
/// first appear. Steps flatten here in one way: the leaves of a step of the last structure
/// seen are read in one native walk; any other step is walked in full (any mapping, named
/// tuples, lists and tuples), its new paths get new columns, and its structure becomes the
/// one expected next.
#[pyclass(name = "StepColumns", module = "reverb._native")]
pub(crate) struct PyStepColumns {
    /// The structure of the last step walked in full, and the column of each of its leaves.
    last: Option<(Node, Vec<usize>)>,
    /// Each column's path.
    paths: Vec<Py<PyTuple>>,
    /// The column of each path (`{path: column}`).
    index: Py<PyDict>,
    /// Whether the column is in the writer's history yet: a step had its path (`configure`
    /// may name a path first).
    seen: Vec<bool>,
    /// How many leaves the last step flattened had.
    width: usize,
}

/// A flattened step: each value's column, the values (`None` leaves left out: a column not
/// set in this step), the columns new to the history with it, and then (`grown`) the column
/// of every leaf, in `tf.nest` order.
pub(crate) struct Flat<'py> {
    pub(crate) columns: Vec<usize>,
    pub(crate) values: Vec<Bound<'py, PyAny>>,
    pub(crate) new: Vec<usize>,
    pub(crate) grown: Option<Vec<usize>>,
}

impl PyStepColumns {
    /// `step` flattened (see the type's doc); ValueError when it has no leaves, TypeError for
    /// a mapping whose keys cannot be sorted, RecursionError for a cyclic nest. With `width`
    /// (the legacy writer's), a step of another number of leaves is a ValueError (the
    /// reference's message) and nothing of it joins the history.
    pub(crate) fn flat<'py>(
        &mut self,
        step: &Bound<'py, PyAny>,
        width: Option<usize>,
    ) -> PyResult<Flat<'py>> {
        let flat = self.walk_step(step)?;
        match width {
            Some(width) if width != self.width => {
                self.forget_columns(&flat.new);
                Err(PyValueError::new_err(format!(
                    "Number of tensors per timestep was inconsistent. Previously it was {width}, \
                     but is now {}.",
                    self.width
                )))
            }
            _ => Ok(flat),
        }
    }

    /// `step` flattened, see [`Self::flat`].
    fn walk_step<'py>(&mut self, step: &Bound<'py, PyAny>) -> PyResult<Flat<'py>> {
        let py = step.py();
        if let Some((node, columns)) = &self.last {
            let mut values = Vec::with_capacity(columns.len());
            if node.flatten(step, &mut values)? {
                self.width = columns.len();
                return Ok(Flat {
                    columns: columns.clone(),
                    values,
                    new: Vec::new(),
                    grown: None,
                });
            }
        }
        let mut leaves = Vec::new();
        walk(step, &mut Vec::new(), &mut leaves, 0)?;
        if leaves.is_empty() {
            return Err(PyValueError::new_err("append() needs at least one value"));
        }
        let mut flat = Flat {
            columns: Vec::with_capacity(leaves.len()),
            values: Vec::with_capacity(leaves.len()),
            new: Vec::new(),
            grown: None,
        };
        let mut every_column = Vec::with_capacity(leaves.len());
        for (path, value) in leaves {
            let column = self.column_of(&PyTuple::new(py, path)?)?;
            every_column.push(column);
            if !std::mem::replace(&mut self.seen[column], true) {
                flat.new.push(column);
            }
            if value.is_none() {
                continue;
            }
            flat.columns.push(column);
            flat.values.push(value);
        }
        self.last = match Node::of(step, 0)? {
            Some(node) if node.count() == every_column.len() => Some((node, every_column.clone())),
            _ => None,
        };
        self.width = every_column.len();
        if !flat.new.is_empty() {
            flat.grown = Some(every_column);
        }
        Ok(flat)
    }

    /// The columns, once no other thread flattens with them. (Flattening may run Python
    /// code, e.g. a custom mapping's, that lets another thread of the writer flatten
    /// meanwhile: that one waits for them, without the GIL.)
    pub(crate) fn borrowed<'py>(slf: &Bound<'py, Self>) -> PyRefMut<'py, Self> {
        loop {
            match slf.try_borrow_mut() {
                Ok(borrowed) => return borrowed,
                Err(_) => slf.py().detach(std::thread::yield_now),
            }
        }
    }

    /// Takes back what flattening a step did to the history's columns (the step was not
    /// appended: its new columns stay out of the history until a step that is).
    pub(crate) fn forget_columns(&mut self, new: &[usize]) {
        if new.is_empty() {
            return;
        }
        for &column in new {
            self.seen[column] = false;
        }
        // (The next step of this structure must be walked in full, to bring them back.)
        self.last = None;
    }

    /// The column of `path`, a new one if it has none yet.
    fn column_of(&mut self, path: &Bound<'_, PyTuple>) -> PyResult<usize> {
        let index = self.index.bind(path.py());
        if let Some(column) = index.get_item(path)? {
            return column.extract();
        }
        let column = self.paths.len();
        index.set_item(path, column)?;
        self.paths.push(path.clone().unbind());
        self.seen.push(false);
        Ok(column)
    }
}

/// `(path, leaf)` of every leaf of `x` in `tf.nest` order, `path` extended from `at`.
fn walk<'py>(
    x: &Bound<'py, PyAny>,
    at: &mut Vec<Bound<'py, PyAny>>,
    out: &mut Vec<(Vec<Bound<'py, PyAny>>, Bound<'py, PyAny>)>,
    depth: usize,
) -> PyResult<()> {
    let py = x.py();
    if depth > MAX_WALK_DEPTH {
        return Err(pyo3::exceptions::PyRecursionError::new_err(
            "maximum recursion depth exceeded while flattening a step (is it cyclic?)",
        ));
    }
    let mut each = |key: Bound<'py, PyAny>, child: Bound<'py, PyAny>, out: &mut Vec<_>| {
        at.push(key);
        let walked = walk(&child, at, out, depth + 1);
        at.pop();
        walked
    };
    if x.is_instance(mapping_type(py)?)? {
        let keys = py
            .import(intern!(py, "builtins"))?
            .getattr(intern!(py, "sorted"))?
            .call1((x,))
            .map_err(|e| {
                if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py) {
                    pyo3::exceptions::PyTypeError::new_err(
                        "nest only supports dicts with sortable keys",
                    )
                } else {
                    e
                }
            })?;
        for key in keys.downcast::<PyList>()?.iter() {
            let child = x.get_item(&key)?;
            each(key, child, out)?;
        }
    } else if let Ok(tuple) = x.downcast::<PyTuple>() {
        // (Named tuples are keyed by field name, as dm-tree does.)
        match x.get_type().getattr(intern!(py, "_fields")) {
            Ok(fields) => {
                for (field, child) in fields.try_iter()?.zip(tuple.iter()) {
                    each(field?, child, out)?;
                }
            }
            Err(_) => {
                for (i, child) in tuple.iter().enumerate() {
                    each(i.into_pyobject(py)?.into_any(), child, out)?;
                }
            }
        }
    } else if let Ok(list) = x.downcast::<PyList>() {
        for (i, child) in list.iter().enumerate() {
            each(i.into_pyobject(py)?.into_any(), child, out)?;
        }
    } else {
        out.push((at.clone(), x.clone()));
    }
    Ok(())
}

#[pymethods]
impl PyStepColumns {
    #[new]
    fn new(py: Python<'_>) -> Self {
        Self {
            last: None,
            paths: Vec::new(),
            index: PyDict::new(py).unbind(),
            seen: Vec::new(),
            width: 0,
        }
    }

    /// `(columns, values, grown)` of `step`: each value's column (`None` leaves are left
    /// out: not set in this step), and when the step brought columns new to the history, the
    /// column of every leaf in `tf.nest` order (else None). With `width`, see `flat`.
    #[allow(clippy::type_complexity)]
    #[pyo3(signature = (step, width=None))]
    fn flatten<'py>(
        slf: &Bound<'py, Self>,
        step: &Bound<'py, PyAny>,
        width: Option<usize>,
    ) -> PyResult<(Vec<usize>, Bound<'py, PyList>, Option<Vec<usize>>)> {
        let flat = Self::borrowed(slf).flat(step, width)?;
        Ok((
            flat.columns,
            PyList::new(step.py(), flat.values)?,
            flat.grown,
        ))
    }

    /// The column of `path` (a tuple), a new one if no step had it yet.
    fn column(&mut self, path: &Bound<'_, PyTuple>) -> PyResult<usize> {
        self.column_of(path)
    }

    /// How many leaves the last step flattened had (`None` ones too).
    #[getter]
    fn width(&self) -> usize {
        self.width
    }

    /// Each column's path, by column.
    #[getter]
    fn paths(&self, py: Python<'_>) -> Vec<Py<PyTuple>> {
        self.paths.iter().map(|p| p.clone_ref(py)).collect()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some((node, _)) = &self.last {
            node.visit(&visit)?;
        }
        for path in &self.paths {
            visit.call(path)?;
        }
        visit.call(&self.index)
    }

    fn __clear__(&mut self) {
        self.last = None;
        self.paths.clear();
    }
}
