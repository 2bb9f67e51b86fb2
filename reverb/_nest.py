"""Minimal nest utilities (no TensorFlow needed), matching `tf.nest` conventions.

Dicts flatten in sorted key order; lists, tuples and namedtuples flatten in order; everything
else (including None, numpy arrays and `tf.TensorSpec`) is a leaf.
"""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Iterator


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def is_nested(x: Any) -> bool:
    """Whether `x` is a dict, list or tuple (and so not a leaf)."""
    return isinstance(x, (collections.abc.Mapping, list, tuple))


def _children(x: Any) -> list[Any]:
    if isinstance(x, collections.abc.Mapping):
        return [x[k] for k in _sorted_keys(x)]
    return list(x)


def _sorted_keys(mapping: collections.abc.Mapping) -> list[Any]:
    try:
        return sorted(mapping)
    except TypeError:
        raise TypeError("nest only supports dicts with sortable keys") from None


def _flatten(x: Any) -> Iterator[Any]:
    if is_nested(x):
        for child in _children(x):
            yield from _flatten(child)
    else:
        yield x


def flatten(structure: Any) -> list[Any]:
    """The leaves of `structure`, in tf.nest order."""
    if type(structure) is dict:
        values = [structure[k] for k in _sorted_keys(structure)]
        if not any(isinstance(v, _NESTED) for v in values):
            return values
    return list(_flatten(structure))


_NESTED = (collections.abc.Mapping, list, tuple)


def flatten_with_path(structure: Any) -> list[tuple[tuple, Any]]:
    """(path, leaf) pairs; a path is the tuple of keys (dict keys, named tuple field names) and
    indices (lists, tuples) leading to the leaf."""
    out: list[tuple[tuple, Any]] = []

    def walk(x: Any, path: tuple) -> None:
        if isinstance(x, collections.abc.Mapping):
            for k in _sorted_keys(x):
                walk(x[k], path + (k,))
        elif _is_namedtuple(x):
            # (Named tuples are keyed by field name, as dm-tree does.)
            for k, child in zip(type(x)._fields, x):
                walk(child, path + (k,))
        elif isinstance(x, (list, tuple)):
            for i, child in enumerate(x):
                walk(child, path + (i,))
        else:
            out.append((path, x))

    walk(structure, ())
    return out


def _rebuild(template: Any, children: list[Any]) -> Any:
    if isinstance(template, collections.abc.Mapping):
        keyed = dict(zip(_sorted_keys(template), children))
        result = {k: keyed[k] for k in template}
        if type(template) is dict:
            return result
        try:
            return type(template)(result)
        except TypeError:  # e.g. defaultdict: keep the values, lose the factory
            return result
    if _is_namedtuple(template):
        return type(template)(*children)
    if isinstance(template, tuple):
        return tuple(children)
    return list(children)


def pack_sequence_as(structure: Any, flat: list[Any]) -> Any:
    """Rebuilds `structure` with the leaves taken from `flat` in order."""
    flat = list(flat)
    it = iter(flat)

    def build(x: Any) -> Any:
        if is_nested(x):
            return _rebuild(x, [build(c) for c in _children(x)])
        try:
            return next(it)
        except StopIteration:
            raise ValueError(
                f"Structure has more leaves than the {len(flat)} values provided"
            ) from None

    result = build(structure)
    if next(it, _SENTINEL) is not _SENTINEL:
        raise ValueError(f"Structure has fewer leaves than the {len(flat)} values provided")
    return result


_SENTINEL = object()


def map_structure(fn: Callable[..., Any], *structures: Any) -> Any:
    """Applies `fn` to corresponding leaves of structures of the same shape."""
    if not structures:
        raise ValueError("map_structure needs at least one structure")
    flats = [flatten(s) for s in structures]
    if any(len(f) != len(flats[0]) for f in flats):
        raise ValueError("Structures have different numbers of leaves")
    return pack_sequence_as(structures[0], [fn(*leaves) for leaves in zip(*flats)])
