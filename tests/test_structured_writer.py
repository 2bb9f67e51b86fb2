"""The structured-writing helpers (`reverb.structured_writer`): reference steps and patterns,
configs and their structure (byte for byte what TensorFlow's structure coder writes),
conditions with every operator, priorities, and `infer_signature`."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from _no_tensorflow import run_without_tensorflow

import reverb
from reverb import structured_writer as sw
from reverb.cc import patterns_pb2

STEP = {"obs": None, "action": None, "extras": {"td": None, "count": None}}
# Flattened (sorted keys): action 0, extras/count 1, extras/td 2, obs 3.
ACTION, COUNT, TD, OBS = 0, 1, 2, 3

Transition = collections.namedtuple("Transition", ["observation", "action", "next"])


def test_reverb_structured_is_the_module() -> None:
    assert reverb.structured is sw
    assert sw.Config is patterns_pb2.StructuredWriterConfig
    assert sw.ConditionProto is patterns_pb2.Condition


def test_reference_steps_build_pattern_nodes_for_every_kind_of_index() -> None:
    ref = sw.create_reference_step(STEP)
    last = ref["obs"][-1]
    assert last.flat_source_index == OBS and last.stop == -1
    assert not last.HasField("start") and not last.HasField("step")
    tail = ref["action"][-3:]
    assert (tail.flat_source_index, tail.start) == (ACTION, -3)
    assert not tail.HasField("stop")
    n = 2
    window = ref["extras"]["td"][-(n + 1) : -n]
    assert (window.flat_source_index, window.start, window.stop) == (TD, -3, -2)
    strided = ref["extras"]["count"][-8::2]
    assert (strided.start, strided.step) == (-8, 2) and not strided.HasField("stop")
    with pytest.raises(ValueError, match="int or a slice"):
        ref["obs"]["x"]


def test_pattern_from_transform_applies_the_transform_to_a_reference_step() -> None:
    pattern = sw.pattern_from_transform(
        STEP, lambda step: {"o": step["obs"][-2:], "a": step["action"][-1]}
    )
    assert set(pattern) == {"o", "a"}
    assert pattern["o"].start == -2 and pattern["a"].stop == -1


def _transition_pattern() -> Transition:
    ref = sw.create_reference_step(STEP)
    return Transition(
        observation=ref["obs"][-2], action=[ref["action"][-2]], next=(ref["obs"][-1],)
    )


def test_create_config_and_unpack_pattern_round_trip() -> None:
    pattern = {"steps": _transition_pattern(), "td": sw.create_reference_step(STEP)["extras"]}
    pattern["td"] = {k: v[-4:] for k, v in pattern["td"].items()}
    condition = sw.Condition.step_index() >= 1
    config = sw.create_config(pattern, "replay", conditions=[condition])
    assert config.table == "replay"
    assert list(config.conditions) == [condition]
    assert config.priority == sw.constant_priority_fn(1.0)
    assert config.priority.constant_fn.value == 1.0
    assert len(config.flat) == 5  # 3 in the transition, 2 in td
    unpacked = sw.unpack_pattern(config)
    assert type(unpacked["steps"]).__name__ == "Transition"
    assert unpacked["steps"].observation == pattern["steps"].observation
    assert unpacked["steps"].action == pattern["steps"].action
    assert unpacked["td"] == pattern["td"]
    # A config without a structure unpacks to its flat list.
    bare = sw.Config(flat=config.flat, table="replay")
    assert sw.unpack_pattern(bare) == list(config.flat)


def test_create_config_refuses_leaves_that_are_not_pattern_nodes() -> None:
    with pytest.raises(ValueError, match="PatternNode"):
        sw.create_config({"a": 1}, "replay")


def test_priorities() -> None:
    assert sw.constant_priority_fn(0.5).constant_fn.value == 0.5
    td = sw.td_error(0.9, STEP, lambda step: step["extras"]["td"])
    assert td.td_error.max_priority_weight == pytest.approx(0.9)
    assert td.td_error.flat_source_index == TD
    config = sw.create_config(_transition_pattern(), "replay", priority=td)
    assert config.priority.WhichOneof("priority_fn") == "td_error"
    with pytest.raises(ValueError, match="one leaf"):
        sw.td_error(0.9, STEP, lambda step: step["extras"])


@pytest.mark.parametrize(
    "build, fields",
    [
        (lambda c: c == 3, {"eq": 3}),
        (lambda c: c != 3, {"eq": 3, "inverse": True}),
        (lambda c: c >= 3, {"ge": 3}),
        (lambda c: c > 3, {"ge": 4}),
        (lambda c: c < 3, {"ge": 3, "inverse": True}),
        (lambda c: c <= 3, {"ge": 4, "inverse": True}),
        (lambda c: c % 4 == 1, {"mod_eq": patterns_pb2.Condition.ModuloEq(mod=4, eq=1)}),
        (
            lambda c: c % 4 != 1,
            {"mod_eq": patterns_pb2.Condition.ModuloEq(mod=4, eq=1), "inverse": True},
        ),
    ],
)
def test_condition_operators(build, fields) -> None:
    for left, builder in [
        ({"step_index": True}, sw.Condition.step_index()),
        ({"steps_since_applied": True}, sw.Condition.steps_since_applied()),
        ({"flat_source_index": COUNT}, sw.Condition.data(STEP)["extras"]["count"]),
    ]:
        assert build(builder) == patterns_pb2.Condition(**left, **fields)


def test_builders_are_not_changed_by_building() -> None:
    builder = sw.Condition.step_index()
    first = builder % 2 == 0
    second = builder >= 5
    assert first.HasField("mod_eq") and not second.HasField("mod_eq")


def test_is_end_episode() -> None:
    assert sw.Condition.is_end_episode() == patterns_pb2.Condition(is_end_episode=True, eq=1)


def test_structures_are_the_bytes_tensorflows_coder_writes() -> None:
    tf = pytest.importorskip("tensorflow")
    from tensorflow.core.protobuf import struct_pb2
    from tensorflow.python.saved_model import nested_structure_coder

    from reverb import _structure

    nests = [
        None,
        {"b": None, "a": [None, (None, None)]},
        Transition(None, [None], {"x": None}),
        [1, 2.5, "s", True],
        {"spec": tf.TensorSpec([None, 3], tf.float32, "obs")},
    ]
    for nest in nests:
        theirs = nested_structure_coder.encode_structure(nest)
        ours = _structure.encode(nest)
        # (Maps have no byte order: compare parsed messages, and decode across.)
        assert struct_pb2.StructuredValue.FromString(ours.SerializeToString()) == theirs, nest
        back = _structure.decode(type(ours).FromString(theirs.SerializeToString()))
        assert back == nest and type(back).__name__ == type(nest).__name__, (back, nest)


def test_infer_signature() -> None:
    tf = pytest.importorskip("tensorflow")
    step_spec = {
        "obs": tf.TensorSpec([3], tf.float32),
        "action": tf.TensorSpec([], tf.int32),
        "extras": {"td": tf.TensorSpec([], tf.float32), "count": tf.TensorSpec([], tf.int64)},
    }
    ref = sw.create_reference_step(STEP)

    def config(n: int, table: str = "replay") -> sw.Config:
        return sw.create_config({"obs": ref["obs"][-n:], "last": ref["action"][-1]}, table)

    same = sw.infer_signature([config(3), config(3)], step_spec)
    assert same["obs"] == tf.TensorSpec([3, 3], tf.float32, "obs")
    assert same["last"] == tf.TensorSpec([], tf.int32, "last")
    varying = sw.infer_signature([config(2), config(3)], step_spec)
    assert varying["obs"].shape.as_list() == [None, 3]
    strided = sw.create_config({"obs": ref["obs"][-5::2], "last": ref["action"][-1]}, "replay")
    assert sw.infer_signature([strided], step_spec)["obs"].shape.as_list() == [3, 3]
    # Arrays describe the steps too.
    arrays = {
        "obs": np.zeros(3, np.float32),
        "action": np.int32(0),
        "extras": {"td": np.float32(0), "count": np.int64(0)},
    }
    assert sw.infer_signature([config(3)], arrays)["obs"].shape.as_list() == [3, 3]
    # Named tuple columns are named by field, as dm-tree names their paths.
    transition = sw.create_config(
        Transition(observation=ref["obs"][-2], action=ref["action"][-2], next=ref["obs"][-1]),
        "replay",
    )
    names = [s.name for s in sw.infer_signature([transition], step_spec)]
    assert names == ["observation", "action", "next"]
    with pytest.raises(ValueError, match="At least one config"):
        sw.infer_signature([], step_spec)
    with pytest.raises(ValueError, match="same table"):
        sw.infer_signature([config(2), config(2, "other")], step_spec)
    other = sw.create_config({"obs": ref["obs"][-2:]}, "replay")
    with pytest.raises(ValueError, match="pattern_structure"):
        sw.infer_signature([config(2), other], step_spec)
    mixed = sw.create_config({"obs": ref["obs"][-2:], "last": ref["obs"][-1]}, "replay")
    with pytest.raises(ValueError, match="multiple dtypes"):
        sw.infer_signature([config(2), mixed], step_spec)


def test_helpers_work_without_tensorflow() -> None:
    result = run_without_tensorflow(
        """
        import sys

        from reverb import structured_writer as sw
        from reverb.cc import patterns_pb2

        step = {"obs": None, "reward": None}
        ref = sw.create_reference_step(step)
        config = sw.create_config(
            {"obs": ref["obs"][-2:], "reward": ref["reward"][-1]},
            "replay",
            conditions=[sw.Condition.step_index() % 2 == 1, sw.Condition.is_end_episode()],
            priority=sw.td_error(0.9, step, lambda s: s["reward"]),
        )
        again = patterns_pb2.StructuredWriterConfig.FromString(config.SerializeToString())
        assert sw.unpack_pattern(again)["obs"].start == -2
        assert "tensorflow" not in sys.modules
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
