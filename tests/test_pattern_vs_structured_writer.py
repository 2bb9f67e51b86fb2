"""`PatternDataset` against the structured writer: the same configs over the same steps make
the same trajectories (hypothesis; kept apart from tests/test_pattern_dataset.py, which the
TensorFlow 2.15 rerun also runs in a virtualenv without hypothesis)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

tf = pytest.importorskip("tensorflow")

from _pattern_scenarios import SPEC, R, run  # noqa: E402

import reverb  # noqa: E402
from reverb import structured_writer as sw  # noqa: E402

C = sw.Condition


# Conditions the property below draws from (left side, comparison); data conditions read `a`
# (= the step number) and `c` (a bool).
_CONDITIONS = [
    lambda: C.step_index() >= 2,
    lambda: C.step_index() % 3 == 1,
    lambda: C.steps_since_applied() >= 2,
    lambda: C.steps_since_applied() % 2 == 0,
    lambda: C.is_end_episode(),
    lambda: C.data(SPEC)["a"] % 4 != 0,
    lambda: C.data(SPEC)["c"] == 1,
    lambda: C.step_index() < 4,
]


@settings(max_examples=12, deadline=None)
@given(
    nodes=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 4), st.integers(0, 3)),
        min_size=1,
        max_size=3,
    ),
    conditions=st.lists(
        st.tuples(st.integers(0, 2), st.lists(st.integers(0, len(_CONDITIONS) - 1), max_size=2)),
        max_size=3,
    ),
    episode=st.integers(2, 6),
    respect=st.booleans(),
)
def test_gives_what_the_structured_writer_inserts(nodes, conditions, episode, respect) -> None:
    """The dataset and a structured writer writing the same steps to a server make the same
    trajectories, in the same order (one rule evaluates both). Each config takes the same
    leaves, `longer` steps further back than the others (so trajectories of one step may
    differ in length). Configs are ordered by how far back they reach, so the reference's
    growing buffer-length conditions change nothing."""

    def pattern(leaf: str, age: int, stop: int) -> Any:
        stop = min(stop, age - 1)
        return R[leaf][-age:-stop] if stop else R[leaf][-age:]

    configs = [
        sw.create_config(
            [pattern(leaf, age + longer, stop) for leaf, age, stop in nodes],
            "t",
            [_CONDITIONS[k]() for k in ks],
        )
        for longer, ks in conditions or [(0, [])]
    ]
    configs.sort(key=lambda c: max(abs(n.start) for n in c.flat))
    n = 13
    ours = run(configs, n, episode, respect)

    server = reverb.Server([reverb.Table.queue("t", 10_000)])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        with client.structured_writer(configs) as writer:
            for i in range(n):
                f = float(i)
                writer.append(
                    {"a": np.int32(i), "b": np.array([f, -f], np.float32), "c": i % 3 == 0}
                )
                if i % episode == episode - 1:
                    writer.end_episode(clear_buffers=respect)
            writer.flush(timeout_ms=10_000)
        size = client.server_info()["t"].current_size
        samples = client.sample("t", num_samples=size, emit_timesteps=False) if size else []
        theirs = [[np.asarray(x).tolist() for x in s.data] for s in samples]
    finally:
        server.stop()
    assert ours == theirs
