//! Errors as Python sees them: one mapping from client errors (by status code) to the
//! classes of `reverb.errors` (`ValueError` for bad arguments and `NotImplementedError` as the
//! reference maps them; RESOURCE_EXHAUSTED is a `ResourceExhaustedError`, an `IndexError` as
//! in the reference), and from server start errors.

use pyo3::exceptions::{PyNotImplementedError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use reverb_client::ClientError;
use reverb_server::StartError;
use tonic::Code;

/// The classes of `reverb.errors` this module raises, imported once.
struct Classes {
    reverb: Py<PyAny>,
    deadline_exceeded: Py<PyAny>,
    not_found: Py<PyAny>,
    unavailable: Py<PyAny>,
    resource_exhausted: Py<PyAny>,
    unauthenticated: Py<PyAny>,
}

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();
    CLASSES.get_or_try_init(py, || {
        let m = py.import("reverb.errors")?;
        Ok(Classes {
            reverb: m.getattr("ReverbError")?.unbind(),
            deadline_exceeded: m.getattr("DeadlineExceededError")?.unbind(),
            not_found: m.getattr("NotFoundError")?.unbind(),
            unavailable: m.getattr("UnavailableError")?.unbind(),
            resource_exhausted: m.getattr("ResourceExhaustedError")?.unbind(),
            unauthenticated: m.getattr("UnauthenticatedError")?.unbind(),
        })
    })
}

/// The Python exception for a client error.
pub(crate) fn client_error(e: ClientError) -> PyErr {
    match e.code {
        Code::InvalidArgument => return PyValueError::new_err(e.message),
        Code::Unimplemented => return PyNotImplementedError::new_err(e.message),
        _ => {}
    }
    Python::attach(|py| {
        let classes = match classes(py) {
            Ok(c) => c,
            Err(_) => return PyRuntimeError::new_err(e.message),
        };
        let class = match e.code {
            Code::DeadlineExceeded => &classes.deadline_exceeded,
            Code::NotFound => &classes.not_found,
            Code::Unavailable => &classes.unavailable,
            Code::ResourceExhausted => &classes.resource_exhausted,
            Code::Unauthenticated => &classes.unauthenticated,
            _ => &classes.reverb,
        };
        match class.bind(py).call1((e.message,)) {
            Ok(value) => PyErr::from_value(value),
            Err(err) => err,
        }
    })
}

/// The Python exception for a server that could not start: `ValueError` for tables or
/// options that are not valid and for a checkpoint that does not fit them (or is corrupt),
/// `OSError` for a port that cannot be bound.
pub(crate) fn start_error(e: StartError) -> PyErr {
    match e {
        StartError::InvalidConfig(m) | StartError::Checkpoint(m) => PyValueError::new_err(m),
        StartError::Io(m) => PyOSError::new_err(m),
    }
}

/// `.py()` turns a client result into a Python one.
pub(crate) trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for reverb_client::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(client_error)
    }
}
