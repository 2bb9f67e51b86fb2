"""numpy dtypes <-> TensorFlow DataType enum values (what chunks carry on the wire)."""

from __future__ import annotations

from typing import Any

import numpy as np

# TensorFlow DataType values (tensorflow/core/framework/types.proto).
_TF_OF_NUMPY = {
    np.dtype(np.float32): 1,
    np.dtype(np.float64): 2,
    np.dtype(np.int32): 3,
    np.dtype(np.uint8): 4,
    np.dtype(np.int16): 5,
    np.dtype(np.int8): 6,
    np.dtype(np.complex64): 8,
    np.dtype(np.int64): 9,
    np.dtype(np.bool_): 10,
    np.dtype(np.uint16): 17,
    np.dtype(np.complex128): 18,
    np.dtype(np.float16): 19,
    np.dtype(np.uint32): 22,
    np.dtype(np.uint64): 23,
}
_NUMPY_OF_TF = {v: k for k, v in _TF_OF_NUMPY.items()}
STRING = 7  # DT_STRING: numpy bytes_, str_ and object arrays of bytes or str


def as_array(value: Any) -> np.ndarray:
    """`np.asarray(value)`, except that Python bytes stay whole (an object array): numpy's
    fixed-width `S` arrays drop trailing NUL bytes, which TensorFlow keeps."""
    array = np.asarray(value)
    if array.dtype.kind == "S" and not isinstance(value, np.ndarray):
        return np.array(value, dtype=object)
    return array


def tf_enum(dtype: np.dtype) -> int:
    """The TensorFlow DataType value of a numpy dtype (either byte order); ValueError when
    unsupported."""
    dtype = np.dtype(dtype)
    if dtype.kind in "SUO":
        return STRING
    if not dtype.isnative:
        dtype = dtype.newbyteorder("=")
    try:
        return _TF_OF_NUMPY[dtype]
    except KeyError:
        raise ValueError(
            f"Unsupported dtype {np.dtype(dtype)}: supported dtypes are "
            f"{sorted(str(d) for d in _TF_OF_NUMPY)}"
        ) from None


def numpy_dtype(tf_value: int) -> np.dtype:
    """The numpy dtype of a TensorFlow DataType value (strings: object arrays of bytes)."""
    if tf_value == STRING:
        return np.dtype(object)
    try:
        return _NUMPY_OF_TF[tf_value]
    except KeyError:
        raise ValueError(f"Unsupported TensorFlow dtype value {tf_value}") from None


def from_column(column: tuple) -> np.ndarray:
    """A native `(tf dtype, shape, flat uint8 array)` column as a numpy array (no copy); a
    string column `(7, shape, list of bytes)` as an object array of bytes, as the
    reference returns strings."""
    dtype, shape, data = column
    if dtype == STRING:
        out = np.empty(len(data), dtype=object)
        out[:] = data
        return out.reshape(shape)
    return data.view(numpy_dtype(dtype)).reshape(shape)


def shape_string(shape: Any) -> str:
    """A shape as the reference's messages print one: `[1,2]`, `?` for an unknown size.
    (Beside dtypes: both name what a column holds in error messages.)"""
    return "[" + ",".join("?" if d is None or d < 0 else str(d) for d in shape) + "]"
