"""Table signatures: nests of `tf.TensorSpec`, carried on the wire as a serialized
`tensorflow.StructuredValue`. TensorFlow is imported only when a signature is used; checks of
steps against a signature are native (`_native.TableSignature`)."""

from __future__ import annotations

from typing import Any, Optional

from reverb import _native, _nest


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
        _native.table_signature(data)  # ValueError unless it is a nest of tensor specs
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
