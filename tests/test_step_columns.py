"""Trajectory writers' steps flattened natively (`_native.StepColumns`): every leaf with the
writer column of its path, in `tf.nest` order (as `reverb._nest.flatten_with_path`), whether a
step has the last step's structure (one native walk) or not (walked in full)."""

from __future__ import annotations

import collections
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reverb import _native, _nest

Point = collections.namedtuple("Point", ["y", "x"])

leaves = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=False, width=32),
    st.booleans(),
    st.binary(max_size=3),
    st.none(),
    st.integers(0, 3).map(lambda n: np.arange(n, dtype=np.float32)),
)
nests = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.dictionaries(st.text("abcz", min_size=1, max_size=2), children, max_size=3),
        st.dictionaries(st.text("ab", min_size=1, max_size=1), children, max_size=2).map(
            types.MappingProxyType
        ),
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.tuples(children, children).map(lambda p: Point(*p)),
    ),
    max_leaves=8,
)


def _check(columns: _native.StepColumns, step: object) -> tuple:
    """Flattens `step` and checks it against `_nest`: returns (columns, grown)."""
    got_columns, values, grown = columns.flatten(step)
    pairs = [(p, v) for p, v in _nest.flatten_with_path(step) if v is not None]
    assert len(got_columns) == len(values) == len(pairs)
    paths = columns.paths
    for column, value, (path, leaf) in zip(got_columns, values, pairs):
        assert value is leaf and paths[column] == path
    assert columns.width == len(_nest.flatten(step))
    return got_columns, grown


@settings(max_examples=300, deadline=None)
@given(st.lists(nests, min_size=1, max_size=4))
def test_steps_flatten_as_nest_does_with_one_column_per_path(steps) -> None:
    columns = _native.StepColumns()
    seen: set = set()
    for step in steps:
        if not _nest.flatten(step):
            with pytest.raises(ValueError, match="at least one value"):
                columns.flatten(step)
            continue
        got, grown = _check(columns, step)
        # Twice: the second time by the last structure.
        assert _check(columns, step) == (got, None)
        paths = columns.paths
        every = [paths.index(path) for path, _ in _nest.flatten_with_path(step)]
        # A step with a path new to the history (its leaf None or not) names the column of
        # every leaf, in nest order.
        assert grown == (every if set(every) - seen else None)
        seen |= set(every)
    assert len(set(columns.paths)) == len(columns.paths)


def test_unsortable_keys_and_cycles_are_refused() -> None:
    columns = _native.StepColumns()
    with pytest.raises(TypeError, match="sortable keys"):
        columns.flatten({1: 1, "a": 2})
    cyclic: list = [1]
    cyclic.append(cyclic)
    with pytest.raises(RecursionError):
        columns.flatten(cyclic)
    # A path named first (`configure`) gets its column; a step grows the history when it
    # first has the path (a None leaf too: a field not set in that step).
    assert columns.column(("b",)) == 0
    assert columns.flatten({"a": 1, "b": None}) == ([1], [1], [1, 0])
    assert columns.flatten({"a": 2, "b": 3}) == ([1, 0], [2, 3], None)
    assert columns.flatten({"c": None}) == ([], [], [2])
