"""Table signatures: nests of `tf.TensorSpec`, carried on the wire as a serialized
`tensorflow.StructuredValue`, and the reference's message when a step does not fit one
(`problem`, for `Client.insert` and the legacy `Writer`). TensorFlow is imported only when a
signature is used."""

from __future__ import annotations

from typing import Any, List, Optional

from reverb import _dtypes, _native, _nest


def _tf() -> Any:
    try:
        import tensorflow as tf
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "Table signatures are nests of tf.TensorSpec and need TensorFlow: "
            "pip install 'tensorflow>=2.15'"
        ) from e
    return tf


def encode(signature: Any) -> Optional[bytes]:
    """Serializes a nest of TensorSpecs (or a `tensorflow.StructuredValue` message, taken
    as it is); ValueError on other leaves."""
    if signature is None:
        return None
    descriptor = getattr(signature, "DESCRIPTOR", None)
    if getattr(descriptor, "full_name", None) == "tensorflow.StructuredValue":
        data = signature.SerializeToString()
        _native.signature_specs(data)  # ValueError unless it is a nest of tensor specs
        return data
    tf = _tf()
    for leaf in _nest.flatten(signature):
        if not isinstance(leaf, tf.TensorSpec):
            raise ValueError(f"Unsupported signature spec: {leaf!r} (expected tf.TensorSpec)")
    from tensorflow.python.saved_model import nested_structure_coder

    return nested_structure_coder.encode_structure(signature).SerializeToString()


def decode(data: bytes) -> Any:
    """The nest of TensorSpecs of a serialized StructuredValue; None when empty or when
    TensorFlow is not installed."""
    if not data:
        return None
    try:
        _tf()
    except ImportError:
        return None
    from tensorflow.core.protobuf import struct_pb2
    from tensorflow.python.saved_model import nested_structure_coder

    return nested_structure_coder.decode_proto(struct_pb2.StructuredValue.FromString(data))


def dims(dims: List[Any]) -> str:
    """`[2, ?]`: dimensions as TensorFlow's errors print them."""
    return "[" + ", ".join("?" if d is None or d < 0 else str(d) for d in dims) + "]"


def _fits(shape: tuple, dims: Optional[list]) -> bool:
    return dims is None or (
        len(shape) == len(dims) and all(d is None or d == n for n, d in zip(shape, dims))
    )


def problem(table: str, specs: list, leaves: list) -> Optional[str]:
    """The reference's message when one step does not fit a table's flat `specs`, else None.
    `leaves` holds (dtype, shape, other accepted shape) per leaf: a leaf fits a spec of its
    shape or of the other one."""
    start = f"Unable to CreateItem in table '{table}' because Append was called with a tensor "
    if len(specs) != len(leaves):
        return (
            f"{start}signature inconsistent with table signature.  Append for timestep offset 0 "
            f"was called with {len(leaves)} tensors, but table requires {len(specs)} tensors "
            "per entry."
        )
    for i, ((dtype, shape, other), (name, want, want_dims)) in enumerate(zip(leaves, specs)):
        if dtype != want or not (_fits(shape, want_dims) or _fits(other, want_dims)):
            expected = "<unknown>" if want_dims is None else dims(want_dims)
            return (
                f"{start}signature inconsistent with the table signature. At timestep offset 0, "
                f"flattened index {i}, saw a tensor of dtype {_dtypes.tf_name(dtype)}, shape "
                f"{dims(shape)}, but expected tensor '{name}' of dtype "
                f"{_dtypes.tf_name(want)} and shape compatible with {expected}."
            )
    return None
