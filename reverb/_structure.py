"""Nests as `tensorflow.StructuredValue` messages, without TensorFlow: dicts, lists, tuples,
named tuples, None, bools, ints, floats, strings and (when TensorFlow is installed) TensorSpecs.
The bytes are those TensorFlow's `nested_structure_coder` writes for the same nest, so either
side decodes what the other encoded."""

from __future__ import annotations

import collections
from typing import Any, Dict, Tuple

from reverb import _proto

StructuredValue = _proto.StructuredValue

# Named tuple types made while decoding, by (name, fields): decoding twice gives one type.
_NAMED_TUPLES: Dict[Tuple[str, Tuple[str, ...]], type] = {}


def _is_named_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def encode(nest: Any) -> Any:
    """The StructuredValue of `nest`; TypeError for leaves it cannot hold."""
    out = StructuredValue()
    if nest is None:
        out.none_value.SetInParent()
    elif isinstance(nest, bool):
        out.bool_value = nest
    elif isinstance(nest, int):
        out.int64_value = nest
    elif isinstance(nest, float):
        out.float64_value = nest
    elif isinstance(nest, str):
        out.string_value = nest
    elif isinstance(nest, dict):
        out.dict_value.SetInParent()
        for key, value in nest.items():
            if not isinstance(key, str):
                raise TypeError(f"Only string dict keys can be encoded, got {key!r}")
            out.dict_value.fields[key].CopyFrom(encode(value))
    elif _is_named_tuple(nest):
        out.named_tuple_value.name = type(nest).__name__
        for key, value in zip(type(nest)._fields, nest):
            pair = out.named_tuple_value.values.add()
            pair.key = key
            pair.value.CopyFrom(encode(value))
    elif isinstance(nest, tuple):
        out.tuple_value.SetInParent()
        for value in nest:
            out.tuple_value.values.add().CopyFrom(encode(value))
    elif isinstance(nest, list):
        out.list_value.SetInParent()
        for value in nest:
            out.list_value.values.add().CopyFrom(encode(value))
    else:
        spec = _tensor_spec(nest)
        if spec is None:
            raise TypeError(f"Cannot encode {nest!r} (type {type(nest).__name__}) in a structure")
        out.tensor_spec_value.CopyFrom(spec)
    return out


def _tensor_spec(value: Any) -> Any:
    """A TensorSpecProto for a `tf.TensorSpec`, or None for anything else."""
    if type(value).__name__ != "TensorSpec" or not hasattr(value, "dtype"):
        return None
    spec = _proto.TensorSpecProto(name=value.name or "", dtype=value.dtype.as_datatype_enum)
    if value.shape.rank is None:
        spec.shape.unknown_rank = True
    else:
        for size in value.shape.as_list():
            spec.shape.dim.add().size = -1 if size is None else size
    return spec


def decode(value: Any) -> Any:
    """The nest a StructuredValue holds (TensorSpecs need TensorFlow)."""
    kind = value.WhichOneof("kind")
    if kind is None and value.ByteSize():
        # (A kind this schema does not hold, e.g. a TypeSpec: refuse rather than lose it.)
        raise ValueError("Cannot decode a StructuredValue of a kind this package does not know")
    if kind == "none_value" or kind is None:
        return None
    if kind in ("bool_value", "int64_value", "float64_value", "string_value"):
        return getattr(value, kind)
    if kind == "dict_value":
        return {key: decode(v) for key, v in sorted(value.dict_value.fields.items())}
    if kind == "tuple_value":
        return tuple(decode(v) for v in value.tuple_value.values)
    if kind == "list_value":
        return [decode(v) for v in value.list_value.values]
    if kind == "named_tuple_value":
        named = value.named_tuple_value
        fields = tuple(pair.key for pair in named.values)
        key = (named.name, fields)
        if key not in _NAMED_TUPLES:
            _NAMED_TUPLES[key] = collections.namedtuple(named.name, fields)  # type: ignore[misc]
        return _NAMED_TUPLES[key](*(decode(pair.value) for pair in named.values))
    if kind == "tensor_spec_value":
        import tensorflow as tf

        spec = value.tensor_spec_value
        shape = (
            None
            if spec.shape.unknown_rank
            else [None if d.size < 0 else d.size for d in spec.shape.dim]
        )
        return tf.TensorSpec(shape, tf.dtypes.as_dtype(spec.dtype), spec.name or None)
    raise ValueError(f"Cannot decode a StructuredValue holding {kind}")
