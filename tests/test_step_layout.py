"""Steps flattened natively (`_native.StepLayout`) exactly as `reverb._nest` flattens them,
and writers that append steps of changing structures store every value in its column."""

from __future__ import annotations

import collections
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reverb
from reverb import _native, _nest, rate_limiters, selectors

Point = collections.namedtuple("Point", ["y", "x"])

leaves = st.one_of(
    st.integers(-5, 5),
    st.floats(allow_nan=False, width=32),
    st.booleans(),
    st.binary(max_size=3),
    st.integers(-5, 5).map(np.int32),
    st.integers(0, 3).map(lambda n: np.arange(n, dtype=np.float32)),
)
nests = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.dictionaries(st.text("abcz", min_size=1, max_size=2), children, max_size=3),
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.tuples(children, children).map(lambda p: Point(*p)),
    ),
    max_leaves=8,
)


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


@settings(max_examples=300, deadline=None)
@given(nests, nests)
def test_a_layout_flattens_as_nest_does_or_declines(step, other) -> None:
    flat = _nest.flatten(step)
    layout = _native.StepLayout.of(step, list(range(len(flat))))
    assert layout is not None
    assert _same(layout.flatten(step), flat)
    # A step of the same structure in new containers (the same leaves) is flattened, not
    # declined: the check below alone would pass if every other step were declined.
    copied = layout.flatten(_nest.map_structure(lambda x: x, step))
    assert copied is not None and _same(copied, flat), (step, copied)
    # Another step: flattened as `_nest` does when its structure is the same, else declined.
    got = layout.flatten(other)
    if got is not None:
        assert _same(got, _nest.flatten(other))
        assert _nest.map_structure(lambda _: 0, other) == _nest.map_structure(lambda _: 0, step)


def test_a_layout_declines_what_python_must_flatten() -> None:
    step = {"a": np.zeros(2), "b": 1}
    layout = _native.StepLayout.of(step, [0, 1])
    assert layout.flatten({"a": None, "b": 1}) is None  # None leaves
    assert layout.flatten({"a": [1.0, 2.0], "b": 1}) is None  # a nest where a leaf was
    assert layout.flatten({"a": object(), "b": 1}) is None  # numpy would convert it
    assert layout.flatten({"a": 1, "c": 1}) is None and layout.flatten({"a": 1}) is None

    class Doubled(dict):
        def __getitem__(self, key: str) -> int:
            return 2 * dict.__getitem__(self, key)

    # (A dict subclass may change item access: Python flattens it.)
    assert _native.StepLayout.of(Doubled(a=1), [0]) is None
    assert _native.StepLayout.of({"a": 1}, [0]).flatten(Doubled(a=1)) is None
    assert _native.StepLayout.of(collections.OrderedDict(a=1), [0]).flatten({"a": 5}) == [5]
    deep: list = [1]
    for _ in range(100):
        deep = [deep]
    assert _native.StepLayout.of(deep, [0]) is None
    mapping = types.MappingProxyType({"a": 1})
    assert _native.StepLayout.of(mapping, [0]) is None  # a mapping that is not a dict
    assert _native.StepLayout.of(step, [0]) is None  # columns for another number of leaves
    assert _native.StepLayout.of(Point(1, 2), [0, 1]).flatten((1, 2)) is None  # tuple type


def _table(name: str) -> reverb.Table:
    return reverb.Table(
        name, selectors.Fifo(), selectors.Fifo(), 100, rate_limiters.MinSize(1), max_times_sampled=1
    )


def test_writers_store_steps_of_changing_structures_in_their_columns(make_server) -> None:
    server = make_server([_table("t"), _table("s")])
    client = server.localhost_client()
    steps = [
        {"obs": {"b": np.float32(1), "a": np.int32(2)}, "r": 0.5},
        {"r": 1.5, "obs": {"a": np.int32(3), "b": np.float32(4)}},  # other insertion order
        {"obs": collections.OrderedDict(b=np.float32(5), a=np.int32(6)), "r": 2.5},
        {"obs": {"b": np.float32(7), "a": np.int32(8)}, "r": 3.5},
    ]
    with client.trajectory_writer(4) as writer:
        for step in steps:
            writer.append(step)
        writer.create_item("t", 1.0, _nest.map_structure(lambda c: c[:], writer.history))
    (sample,) = client.sample("t", emit_timesteps=False)
    a, b, r = (d.tolist() for d in sample.data)
    assert (a, b, r) == ([2, 3, 6, 8], [1.0, 4.0, 5.0, 7.0], [0.5, 1.5, 2.5, 3.5])

    config = reverb.structured_writer.create_config(
        reverb.structured_writer.pattern_from_transform(
            {"obs": {"a": 0, "b": 0}, "r": 0}, lambda s: (s["obs"]["a"][-2:], s["r"][-1])
        ),
        "s",
    )
    with client.structured_writer([config]) as writer:
        for step in steps:
            writer.append(step)
        with pytest.raises(ValueError, match="unexpected length"):
            writer.append({"obs": {"a": np.int32(0)}, "r": 0.0})
    got = [[d.tolist() for d in s.data] for s in client.sample("s", 3, emit_timesteps=False)]
    assert got == [[[2, 3], 1.5], [[3, 6], 2.5], [[6, 8], 3.5]]
