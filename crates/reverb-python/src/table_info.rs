//! `_native.TableInfo`: a table's `TableInfo` as the native client decoded it, read by the
//! Python client's checks (`max_times_sampled`, the flat signature) without decoding
//! it again; `serialized()` gives the message for the public API's protos.

use crate::signature::PyTableSignature;
use prost::Message;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;
use reverb_proto::TableInfo;

/// One table's `TableInfo`.
#[pyclass(name = "TableInfo", module = "reverb._native", frozen)]
pub(crate) struct PyTableInfo {
    info: TableInfo,
    /// The flat signature, decoded on first use (None: the table has none).
    signature: PyOnceLock<Option<Py<PyTableSignature>>>,
}

impl PyTableInfo {
    pub(crate) fn new(info: TableInfo) -> Self {
        Self {
            info,
            signature: PyOnceLock::new(),
        }
    }
}

#[pymethods]
impl PyTableInfo {
    #[getter]
    fn name(&self) -> &str {
        &self.info.name
    }

    #[getter]
    fn max_times_sampled(&self) -> i32 {
        self.info.max_times_sampled
    }

    /// The serialized `StructuredValue` signature (empty without one).
    #[getter]
    fn signature_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.info.signature)
    }

    /// The signature flattened (None without one), decoded once; ValueError when it is not a
    /// nest of tensor specs.
    #[getter]
    fn signature(&self, py: Python<'_>) -> PyResult<Option<Py<PyTableSignature>>> {
        let signature = self.signature.get_or_try_init(py, || {
            PyTableSignature::decode(&self.info.signature)?
                .map(|s| Py::new(py, s))
                .transpose()
        })?;
        Ok(signature.as_ref().map(|s| s.clone_ref(py)))
    }

    /// The serialized `TableInfo` message.
    fn serialized<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.info.encode_to_vec())
    }

    fn __repr__(&self) -> String {
        format!(
            "TableInfo(name={:?}, current_size={}, max_size={})",
            self.info.name, self.info.current_size, self.info.max_size
        )
    }
}
