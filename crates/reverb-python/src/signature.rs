//! Table signatures for Python: decoded once per table, and the reference's message when a
//! step does not fit one (`Client.insert` and the legacy `Writer` check with it; the native
//! writers with the same `reverb_client::signature` code).

use crate::errors::client_error;
use pyo3::prelude::*;
use reverb_client::signature::{decode_signature, step_problem, tf_name, Spec};

/// One leaf of a table signature: name, TF dtype, dims (None: unknown rank).
type FlatSpec = (String, i32, Option<Vec<i64>>);

/// A table's signature, flattened in `tf.nest` order (decoded without TensorFlow).
#[pyclass(name = "TableSignature", module = "reverb._native", frozen)]
pub(crate) struct PyTableSignature {
    specs: Vec<Spec>,
}

#[pymethods]
impl PyTableSignature {
    /// The leaves as `(name, TF dtype, dims or None for an unknown rank)`; -1 for an unknown
    /// size.
    #[getter]
    fn specs(&self) -> Vec<FlatSpec> {
        self.specs
            .iter()
            .map(|s| (s.name.clone(), s.dtype, s.shape.clone()))
            .collect()
    }

    fn __len__(&self) -> usize {
        self.specs.len()
    }

    /// The reference's message when one step does not fit (None when it does): `leaves` holds
    /// each leaf's TF dtype, its shape and another shape it may fit by (with a leading time
    /// dimension of 1 for an insert; `[T, ...]` for a legacy writer's item column).
    fn problem(&self, table: &str, leaves: Vec<(i32, Vec<i64>, Vec<i64>)>) -> Option<String> {
        let leaves: Vec<(i32, &[i64], &[i64])> = leaves
            .iter()
            .map(|(dtype, shape, other)| (*dtype, shape.as_slice(), other.as_slice()))
            .collect();
        step_problem(table, &self.specs, &leaves)
    }
}

impl PyTableSignature {
    /// The signature of a serialized `TableInfo.signature`; None when the table has none (or
    /// it has no leaves). ValueError when it is not a nest of tensor specs.
    pub(crate) fn decode(signature: &[u8]) -> PyResult<Option<Self>> {
        let specs = decode_signature(signature).map_err(client_error)?;
        Ok(specs
            .filter(|specs| !specs.is_empty())
            .map(|specs| Self { specs }))
    }
}

/// The signature of a serialized `TableInfo.signature` (see [`PyTableSignature::decode`]).
#[pyfunction]
pub(crate) fn table_signature(signature: &[u8]) -> PyResult<Option<PyTableSignature>> {
    PyTableSignature::decode(signature)
}

/// A TensorFlow DataType value named as TensorFlow's errors name it (`float`, `double`,
/// `int32`, `string`, ...).
#[pyfunction]
pub(crate) fn tf_dtype_name(dtype: i32) -> String {
    tf_name(dtype)
}
