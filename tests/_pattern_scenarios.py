"""PatternDataset scenarios that run unchanged on our package and on dm-reverb 0.14: configs
applied to a `tf.data` stream of steps (a = i as int32, b = [i, -i] as float32, c = i % 3 == 0)
whose episodes end every few steps. `python _pattern_scenarios.py` prints every scenario's
trajectories as JSON (tests/test_interop.py runs it with the reference and compares)."""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Tuple

import tensorflow as tf

import reverb
from reverb import structured_writer as sw

C = sw.Condition
SPEC = {
    "a": tf.TensorSpec([], tf.int32),
    "b": tf.TensorSpec([2], tf.float32),
    "c": tf.TensorSpec([], tf.bool),
}
R = sw.create_reference_step(SPEC)


def steps(n: int) -> tf.data.Dataset:
    def step(i: Any) -> dict:
        i = tf.cast(i, tf.int32)
        f = tf.cast(i, tf.float32)
        return {"a": i, "b": tf.stack([f, -f]), "c": tf.equal(i % 3, 0)}

    return tf.data.Dataset.range(n).map(step)


def _flat(data: Any) -> Any:
    if isinstance(data, dict):
        return [_flat(data[k]) for k in sorted(data)]
    if isinstance(data, (list, tuple)):
        return [_flat(x) for x in data]
    return data.numpy().tolist()


def run(configs: List[Any], n: int, episode: int, respect: bool) -> list:
    """The trajectories of `configs` over `n` steps in episodes of `episode` steps."""
    dataset = reverb.PatternDataset(
        steps(n), configs, respect, lambda step: tf.equal(step["a"] % episode, episode - 1)
    )
    return [_flat(x) for x in dataset]


def _transition(n: int) -> dict:
    return {"o": R["a"][-(n + 1)], "n": R["a"][-1], "r": R["b"][-(n + 1) : -1]}


SCENARIOS: Dict[str, Tuple[List[Any], int, int, bool]] = {
    "slices_respecting_episodes": (
        [sw.create_config({"x": R["a"][-3:], "y": R["b"][-1]}, "t")],
        11,
        4,
        True,
    ),
    "slices_across_episodes": (
        [sw.create_config({"x": R["a"][-3:], "y": R["b"][-1]}, "t")],
        11,
        4,
        False,
    ),
    "n_step_transitions": (
        [sw.create_config(_transition(3), "t", [C.step_index() >= 3])]
        + [sw.create_config(_transition(k), "t", [C.is_end_episode()]) for k in (1, 2)],
        14,
        6,
        True,
    ),
    "conditions": (
        [
            sw.create_config(R["a"][-1], "t", [C.step_index() % 2 == 0]),
            sw.create_config(R["a"][-1], "t", [C.steps_since_applied() >= 3]),
            sw.create_config(R["a"][-1], "t", [C.data(SPEC)["c"] == 1]),
            sw.create_config(R["a"][-1], "t", [C.data(SPEC)["a"] % 3 != 1, C.data(SPEC)["a"] > 1]),
        ],
        12,
        5,
        True,
    ),
    "strided_and_end_of_episode": (
        [
            sw.create_config(R["a"][-6::2], "t"),
            sw.create_config(R["a"][-5:-1:2], "t", [C.step_index() < 6]),
            sw.create_config(R["a"][-2:], "t", [C.is_end_episode()]),
        ],
        20,
        7,
        True,
    ),
}


if __name__ == "__main__":
    names = sys.argv[1:] or list(SCENARIOS)
    print("RESULTS" + json.dumps({n: run(*SCENARIOS[n]) for n in names}))
