//! `StepLayout`: the nest structure of a writer's last step, so the next steps of that
//! structure flatten in one native walk instead of Python's general nest code.
//!
//! Flattening follows `reverb._nest`'s (and `tf.nest`'s) order: dicts by sorted key, lists
//! and tuples (named tuples too) in order, anything else is a leaf.

use crate::numpy::is_plain_leaf;
use pyo3::gc::PyVisit;
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

    /// The writer column of each leaf, in flattening order.
    #[getter]
    fn columns(&self) -> Vec<usize> {
        self.columns.clone()
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
