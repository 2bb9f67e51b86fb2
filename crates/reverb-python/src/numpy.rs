//! numpy arrays in and out: any array-like becomes an [`Array`] the writers read in place, or a
//! [`Tensor`] (one copy of its bytes), and
//! tensors go back as `(dtype, shape, uint8 array)` triples that Python views with its dtype.

use numpy::npyffi::PY_ARRAY_API;
use numpy::{PyArray1, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};
use reverb_client::tensor::TensorView;
use reverb_client::tensor::{encode_strings, DTYPES, DT_STRING};
use reverb_client::Tensor;

/// The TensorFlow DataType value of a numpy dtype, by its kind and size (numpy names its
/// numeric dtypes after them, and the client's `DTYPES` table uses those names).
fn tf_dtype_of_numpy(kind: u8, itemsize: usize) -> Option<i32> {
    let prefix = match kind {
        b'b' => "bool",
        b'i' => "int",
        b'u' => "uint",
        b'f' => "float",
        b'c' => "complex",
        _ => return None,
    };
    let bits = |n: &str| n.strip_prefix(prefix).map(str::parse::<usize>);
    DTYPES
        .iter()
        .find(|(_, n, size)| {
            *size == itemsize && (kind == b'b' && *n == "bool" || bits(n) == Some(Ok(size * 8)))
        })
        .map(|(d, _, _)| *d as i32)
}

/// Any numpy-convertible value as a C-contiguous, native-order array (no copy when it is one
/// already), with its TensorFlow dtype and shape.
pub(crate) fn to_array<'py>(py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Array<'py>> {
    let array = match value.downcast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) if value.is_instance(numpy_generic(py)?)? => {
            // SAFETY: `value` is a numpy scalar (checked above) and the GIL is held;
            // PyArray_FromScalar returns a new reference to a 0-d array, or NULL with a
            // Python error set.
            let array = unsafe {
                let ptr = PY_ARRAY_API.PyArray_FromScalar(py, value.as_ptr(), std::ptr::null_mut());
                Bound::from_owned_ptr_or_err(py, ptr)?
            };
            array.downcast_into::<PyUntypedArray>()?
        }
        // Scalars and sequences: numpy decides the dtype, as in the reference.
        Err(_) => {
            let numpy = numpy_module(py)?;
            let array = numpy
                .call_method1(intern!(py, "asarray"), (value,))?
                .downcast_into::<PyUntypedArray>()?;
            if array.dtype().kind() == b'S' {
                // Python bytes kept whole: numpy's fixed-width `S` drops trailing NUL bytes
                // (TensorFlow keeps them).
                numpy
                    .call_method1(intern!(py, "array"), (value, intern!(py, "object")))?
                    .downcast_into::<PyUntypedArray>()?
            } else {
                array
            }
        }
    };
    let array = if array.is_c_contiguous() {
        array
    } else {
        // (ascontiguousarray only changes the shape of 0-d arrays, which are always contiguous.)
        numpy_module(py)?
            .call_method1(intern!(py, "ascontiguousarray"), (array,))?
            .downcast_into::<PyUntypedArray>()?
    };
    let array = if array.dtype().is_native_byteorder() == Some(false) {
        let native = array
            .dtype()
            .call_method1(intern!(py, "newbyteorder"), ("=",))?;
        array
            .call_method1(intern!(py, "astype"), (native,))?
            .downcast_into::<PyUntypedArray>()?
    } else {
        array
    };
    let descr = array.dtype();
    let shape: Vec<i64> = array.shape().iter().map(|&d| d as i64).collect();
    if matches!(descr.kind(), b'S' | b'U' | b'O') {
        let strings = string_list(py, &array)?;
        return Ok(Array {
            nbytes: strings.len(),
            array,
            dtype: DT_STRING,
            shape,
            strings: Some(strings),
        });
    }
    let dtype = tf_dtype_of_numpy(descr.kind(), descr.itemsize()).ok_or_else(|| {
        PyValueError::new_err(format!(
            "Unsupported dtype {descr}: supported are numbers, bool, and strings (bytes, str \
             or objects that are all bytes or str)"
        ))
    })?;
    let nbytes = array.len() * descr.itemsize();
    Ok(Array {
        array,
        dtype,
        shape,
        nbytes,
        strings: None,
    })
}

/// The elements of a bytes, str or object array as a string list (str as UTF-8, as
/// TensorFlow converts them); other objects are a ValueError.
fn string_list(py: Python<'_>, array: &Bound<'_, PyUntypedArray>) -> PyResult<Vec<u8>> {
    let items = array
        .call_method0(intern!(py, "ravel"))?
        .call_method0(intern!(py, "tolist"))?;
    let items = items.downcast::<PyList>()?;
    let mut owned: Vec<Vec<u8>> = Vec::with_capacity(items.len());
    for item in items.iter() {
        if let Ok(b) = item.downcast::<PyBytes>() {
            owned.push(b.as_bytes().to_vec());
        } else if let Ok(s) = item.downcast::<PyString>() {
            owned.push(s.to_cow()?.as_bytes().to_vec());
        } else {
            return Err(PyValueError::new_err(format!(
                "Unsupported object of type {} in an array of strings (only bytes and str)",
                item.get_type().name()?
            )));
        }
    }
    Ok(encode_strings(owned.iter().map(Vec::as_slice)))
}

/// A contiguous numpy array held for a call (see [`to_array`]).
pub(crate) struct Array<'py> {
    array: Bound<'py, PyUntypedArray>,
    dtype: i32,
    shape: Vec<i64>,
    nbytes: usize,
    /// A string array's elements as a string list (the array's own buffer holds pointers or
    /// padded characters, not that).
    strings: Option<Vec<u8>>,
}

impl Array<'_> {
    /// The array's bytes, borrowed.
    ///
    /// # Safety
    /// The caller holds the GIL for as long as it reads the view and runs no Python code
    /// meanwhile (Python code could resize or free the buffer, e.g. `resize(refcheck=False)`).
    pub(crate) unsafe fn view(&self) -> TensorView<'_> {
        let data = if let Some(strings) = &self.strings {
            &strings[..]
        } else if self.nbytes == 0 {
            &[][..]
        } else {
            // SAFETY: the array is C-contiguous and holds `nbytes` bytes at `data`; `self`
            // keeps a strong reference to it, and by this function's contract no Python code
            // runs while the view is read, so nothing can free or move the buffer.
            unsafe {
                let ptr = (*self.array.as_array_ptr()).data as *const u8;
                std::slice::from_raw_parts(ptr, self.nbytes)
            }
        };
        TensorView {
            dtype: self.dtype,
            shape: &self.shape,
            data,
        }
    }

    /// An owned copy of the array (made with the GIL held).
    pub(crate) fn to_tensor(&self, _py: Python<'_>) -> Tensor {
        // SAFETY: `_py` proves the GIL is held, and no Python code runs during the copy.
        let view = unsafe { self.view() };
        Tensor {
            dtype: view.dtype,
            shape: view.shape.to_vec(),
            data: view.data.to_vec(),
        }
    }
}

/// Whether `value` is a leaf numpy takes as it is: an array, a numpy scalar, or a Python
/// bool, int, float, bytes or str (never a nest, so a step of them needs no general flattening).
pub(crate) fn is_plain_leaf(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(value.downcast::<PyUntypedArray>().is_ok()
        || value.is_exact_instance_of::<PyFloat>()
        || value.is_exact_instance_of::<PyInt>()
        || value.is_exact_instance_of::<PyBool>()
        || value.is_exact_instance_of::<PyBytes>()
        || value.is_exact_instance_of::<PyString>()
        || value.is_instance(numpy_generic(py)?)?)
}

/// The numpy dtype of a TensorFlow DataType value (strings: object, as the reference returns
/// them); ValueError for one this library does not hold.
pub(crate) fn numpy_dtype(py: Python<'_>, dtype: i32) -> PyResult<Bound<'_, PyAny>> {
    let name = if dtype == DT_STRING {
        "object"
    } else {
        DTYPES
            .iter()
            .find(|(d, _, _)| *d as i32 == dtype)
            .map(|(_, name, _)| *name)
            .ok_or_else(|| {
                PyValueError::new_err(format!("Unsupported TensorFlow dtype value {dtype}"))
            })?
    };
    numpy_module(py)?
        .getattr(intern!(py, "dtype"))?
        .call1((name,))
}

/// A tensor as a numpy array of its dtype and shape: numbers view the tensor's bytes (no
/// copy), strings become an object array of bytes.
pub(crate) fn array_out(py: Python<'_>, t: Tensor) -> PyResult<Bound<'_, PyAny>> {
    let flat = if t.dtype == DT_STRING {
        let elements: Vec<Py<PyAny>> = t
            .strings()
            .map_err(crate::errors::client_error)?
            .into_iter()
            .map(|e| PyBytes::new(py, e).into_any().unbind())
            .collect();
        PyArray1::from_vec(py, elements).into_any()
    } else {
        let dtype = numpy_dtype(py, t.dtype)?;
        PyArray1::from_vec(py, t.data).call_method1(intern!(py, "view"), (dtype,))?
    };
    flat.call_method1(intern!(py, "reshape"), (t.shape,))
}

/// `numpy.integer`, the type of numpy integer scalars.
pub(crate) fn numpy_integer(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static INTEGER: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    INTEGER.import(py, "numpy", "integer")
}

/// `numpy.generic`, the type of numpy scalars.
fn numpy_generic(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static GENERIC: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    GENERIC.import(py, "numpy", "generic")
}

fn numpy_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: pyo3::sync::PyOnceLock<Py<PyModule>> = pyo3::sync::PyOnceLock::new();
    Ok(NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

/// A tensor as `(dtype, shape, uint8 array)` (the array owns the bytes, no copy); a string
/// tensor as `(dtype, shape, list of bytes)`.
pub(crate) fn column_out<'py>(py: Python<'py>, t: Tensor) -> PyResult<Bound<'py, PyTuple>> {
    if t.dtype == DT_STRING {
        let elements = t.strings().map_err(crate::errors::client_error)?;
        let list = PyList::new(py, elements.into_iter().map(|e| PyBytes::new(py, e)))?;
        return PyTuple::new(
            py,
            [
                t.dtype.into_pyobject(py)?.into_any(),
                PyList::new(py, t.shape)?.into_any(),
                list.into_any(),
            ],
        );
    }
    let data = PyArray1::from_vec(py, t.data);
    PyTuple::new(
        py,
        [
            t.dtype.into_pyobject(py)?.into_any(),
            PyList::new(py, t.shape)?.into_any(),
            data.into_any(),
        ],
    )
}
