"""Structured-writer scenarios that run unchanged on our package and on dm-reverb 0.14: each
is a list of configs and a script of appends and episode ends, written to a server of two
queue tables; the result is every item of each table, in order, as (priority, data) with
data flattened to lists. `python _structured_scenarios.py [names]` prints the results as
JSON (tests/test_interop.py runs it with the reference and compares)."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Tuple

import numpy as np

import reverb
from reverb import structured_writer as sw

C = sw.Condition
STEP = {"a": None, "b": None, "c": None}  # flattened: a 0, b 1, c 2
R = sw.create_reference_step(STEP)
TABLES = ("q", "r")


def steps(n: int, start: int = 0, none: Tuple[Tuple[str, int], ...] = ()) -> List[Any]:
    """Appends of steps `start..start+n`: a = i (int32), b = 10 i + 0.5, c = (i % 3 == 0)."""
    return [
        (
            "append",
            {
                "a": None if ("a", i) in none else np.int32(i),
                "b": np.float32(i * 10 + 0.5),
                "c": np.bool_(i % 3 == 0),
            },
            False,
        )
        for i in range(start, start + n)
    ]


def _flat(data: Any) -> Any:
    if isinstance(data, dict):
        return [_flat(data[k]) for k in sorted(data)]
    if isinstance(data, (list, tuple)):
        return [_flat(x) for x in data]
    return np.asarray(data).tolist()


def run(configs: List[Any], script: List[Any]) -> Dict[str, list]:
    """Runs a scenario on a fresh server; returns each table's items."""
    server = reverb.Server([reverb.Table.queue(t, 1000) for t in TABLES])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        writer = client.structured_writer(configs)
        for op in script:
            if op[0] == "append":
                writer.append(op[1], partial_step=op[2])
            else:
                writer.end_episode(clear_buffers=op[1])
        writer.flush(timeout_ms=10_000)
        out: Dict[str, list] = {}
        for table in TABLES:
            n = client.server_info()[table].current_size
            samples = client.sample(table, num_samples=n, emit_timesteps=False) if n else []
            out[table] = [[float(s.info.priority), _flat(s.data)] for s in samples]
        return out
    finally:
        server.stop()


def _partial(i: int) -> List[Any]:
    return [
        ("append", {"a": np.int32(i), "b": None, "c": None}, True),
        ("append", {"a": None, "b": np.float32(i), "c": np.bool_(True)}, False),
    ]


def _td(w: float) -> Any:
    return sw.td_error(w, STEP, lambda s: s["b"])


SCENARIOS: Dict[str, Tuple[List[Any], List[Any]]] = {
    "history_too_short_after_episode": (
        [sw.create_config({"x": R["a"][-3:], "y": R["b"][-1]}, "q")],
        steps(5) + [("end", True)] + steps(2, 10),
    ),
    "step_index_modulo": (
        [sw.create_config(R["a"][-2:], "q", conditions=[C.step_index() % 2 == 0])],
        steps(7),
    ),
    "steps_since_applied_across_episodes": (
        [sw.create_config(R["a"][-1], "q", conditions=[C.steps_since_applied() >= 3])],
        steps(8) + [("end", True)] + steps(4, 20),
    ),
    "end_of_episode": (
        [
            sw.create_config(R["a"][-3:], "q", conditions=[C.is_end_episode()]),
            sw.create_config(R["b"][-1], "r", conditions=[C.step_index() < 2]),
        ],
        steps(2) + [("end", True)] + steps(5, 10) + [("end", True)],
    ),
    "none_leaves": (
        [
            sw.create_config({"x": R["a"][-2:], "b": R["b"][-1]}, "q"),
            sw.create_config(R["b"][-2:], "r"),
        ],
        steps(6, none=(("a", 2),)),
    ),
    "partial_steps": (
        [sw.create_config({"a": R["a"][-2:], "b": R["b"][-1]}, "q")],
        [op for i in range(4) for op in _partial(i)],
    ),
    "stepped_slices": (
        [sw.create_config(R["a"][-6::2], "q"), sw.create_config(R["a"][-5:-1:2], "r")],
        steps(8),
    ),
    "n_step_transition": (
        [
            sw.create_config({"o": R["a"][-3], "n": R["a"][-1], "r": R["b"][-3:-1]}, "q"),
            sw.create_config(R["a"][-2:-1], "r", conditions=[C.is_end_episode()]),
        ],
        steps(5) + [("end", True)],
    ),
    "td_error_priority": (
        [
            sw.create_config({"t": R["b"][-3:]}, "q", priority=_td(0.25)),
            sw.create_config({"t": R["a"][-1]}, "r", priority=_td(0.5)),
        ],
        [
            ("append", {"a": np.int32(i), "b": np.float32((-1) ** i * i), "c": np.bool_(0)}, False)
            for i in range(5)
        ],
    ),
    "keep_buffers_across_episodes": (
        [sw.create_config(R["a"][-3:], "q")],
        steps(2) + [("end", False)] + steps(3, 10),
    ),
    "data_conditions": (
        [
            sw.create_config(R["a"][-1], "q", conditions=[C.data(STEP)["c"] == 1]),
            sw.create_config(
                R["a"][-1], "r", conditions=[C.data(STEP)["a"] % 3 != 1, C.data(STEP)["a"] > 1]
            ),
        ],
        steps(9),
    ),
    # Python bools (not numpy's) in a data condition's leaf, as `{'b': True}` steps give.
    "data_condition_on_python_bools": (
        [sw.create_config(R["a"][-1], "q", conditions=[C.data(STEP)["c"] == 1])],
        [
            ("append", {"a": np.int32(i), "b": np.float32(i), "c": i % 2 == 1}, False)
            for i in range(5)
        ],
    ),
    "comparisons": (
        [
            sw.create_config(R["a"][-1], "q", conditions=[C.step_index() > 1, C.step_index() < 4]),
            sw.create_config(R["a"][-1], "r", conditions=[C.steps_since_applied() == 2]),
        ],
        steps(7),
    ),
    "constant_priority_and_le_ne": (
        [
            sw.create_config(R["a"][-1], "q", priority=sw.constant_priority_fn(2.5)),
            sw.create_config(
                R["a"][-1], "r", conditions=[C.step_index() <= 1, C.step_index() != 0]
            ),
        ],
        steps(4),
    ),
    "end_of_episode_with_open_step": (
        [
            sw.create_config(R["a"][-1], "q", conditions=[C.is_end_episode()]),
            sw.create_config(R["b"][-2:], "r"),
        ],
        [
            ("append", {"a": np.int32(1), "b": np.float32(1), "c": None}, False),
            ("append", {"a": np.int32(2), "b": None, "c": None}, True),
            ("end", True),
        ],
    ),
    "episode_ends_twice": (
        [
            sw.create_config(R["a"][-1], "q", conditions=[C.is_end_episode()]),
            sw.create_config(R["a"][-1], "r"),
        ],
        steps(2)
        + [("end", True), ("end", True)]
        + steps(1, 5)
        + [("end", False)]
        + steps(1, 7)
        + [("end", True)],
    ),
}


if __name__ == "__main__":
    names = sys.argv[1:] or list(SCENARIOS)
    print("RESULTS" + json.dumps({n: run(*SCENARIOS[n]) for n in names}))
