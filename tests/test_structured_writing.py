"""`StructuredWriter` end to end: configs applied at exactly the right steps with exact data
(across episodes, partial steps and `None` leaves), end-of-episode configs, priorities,
against a model of the semantics on random configs and scripts, and bad input (refused with
a clear error, nothing stored lost)."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
from _no_tensorflow import run_without_tensorflow
from _structured_scenarios import SCENARIOS, TABLES, _flat, run
from _wait import wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reverb
from reverb import structured_writer as sw
from reverb.cc import patterns_pb2

C = sw.Condition
STEP = {"a": None, "b": None, "c": None}
R = sw.create_reference_step(STEP)

# What each scenario must insert: (priority, flattened data) per table, in order. Worked out
# by hand from the semantics (and what dm-reverb 0.14 inserts: tests/test_interop.py).
EXPECTED: Dict[str, Dict[str, list]] = {
    # a[-3:] needs three steps: none after the episode ends with two.
    "history_too_short_after_episode": {
        "q": [[1.0, [[0, 1, 2], 20.5]], [1.0, [[1, 2, 3], 30.5]], [1.0, [[2, 3, 4], 40.5]]],
        "r": [],
    },
    "step_index_modulo": {"q": [[1.0, [[1, 2]]], [1.0, [[3, 4]]], [1.0, [[5, 6]]]], "r": []},
    # The count since the last item carries over into the next episode.
    "steps_since_applied_across_episodes": {
        "q": [[1.0, [2]], [1.0, [5]], [1.0, [20]], [1.0, [23]]],
        "r": [],
    },
    "end_of_episode": {
        "q": [[1.0, [[12, 13, 14]]]],
        "r": [[1.0, [0.5]], [1.0, [10.5]], [1.0, [100.5]], [1.0, [110.5]]],
    },
    # Step 2 has no `a`: no item takes it.
    "none_leaves": {
        "q": [[1.0, [10.5, [0, 1]]], [1.0, [40.5, [3, 4]]], [1.0, [50.5, [4, 5]]]],
        "r": [[1.0, [[b - 10, b]]] for b in (10.5, 20.5, 30.5, 40.5, 50.5)],
    },
    "partial_steps": {
        "q": [[1.0, [[0, 1], 1.0]], [1.0, [[1, 2], 2.0]], [1.0, [[2, 3], 3.0]]],
        "r": [],
    },
    "stepped_slices": {
        "q": [[1.0, [[0, 2, 4]]], [1.0, [[1, 3, 5]]], [1.0, [[2, 4, 6]]]],
        "r": [[1.0, [[0, 2]]], [1.0, [[1, 3]]], [1.0, [[2, 4]]], [1.0, [[3, 5]]]],
    },
    "n_step_transition": {
        "q": [[1.0, [2, 0, [0.5, 10.5]]], [1.0, [3, 1, [10.5, 20.5]]], [1.0, [4, 2, [20.5, 30.5]]]],
        "r": [[1.0, [[3]]]],
    },
    # 0.25 * max|td| + 0.75 * mean|td|; 0 when the item does not hold the TD leaf.
    "td_error_priority": {
        "q": [[1.25, [[0.0, -1.0, 2.0]]], [2.25, [[-1.0, 2.0, -3.0]]], [3.25, [[2.0, -3.0, 4.0]]]],
        "r": [[0.0, [i]] for i in range(5)],
    },
    "keep_buffers_across_episodes": {
        "q": [[1.0, [[0, 1, 10]]], [1.0, [[1, 10, 11]]], [1.0, [[10, 11, 12]]]],
        "r": [],
    },
    # Steps 1 and 3 have c == True.
    "data_condition_on_python_bools": {"q": [[1.0, [1]], [1.0, [3]]], "r": []},
    "data_conditions": {
        "q": [[1.0, [0]], [1.0, [3]], [1.0, [6]]],
        "r": [[1.0, [i]] for i in (2, 3, 5, 6, 8)],
    },
    "comparisons": {"q": [[1.0, [2]], [1.0, [3]]], "r": [[1.0, [1]], [1.0, [3]], [1.0, [5]]]},
    "constant_priority_and_le_ne": {"q": [[2.5, [i]] for i in range(4)], "r": [[1.0, [1]]]},
    "end_of_episode_with_open_step": {"q": [[1.0, [2]]], "r": []},
    "episode_ends_twice": {
        "q": [[1.0, [1]], [1.0, [5]], [1.0, [7]]],
        "r": [[1.0, [0]], [1.0, [1]], [1.0, [5]], [1.0, [7]]],
    },
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenarios_insert_exactly_the_expected_items(name, both_paths) -> None:
    assert run(*SCENARIOS[name]) == EXPECTED[name]


# A model of the semantics, written independently of the native code, for random checks.


class _Model:
    """What a structured writer must insert, computed the plain way: keep every step since
    the buffers were cleared and evaluate each config from scratch."""

    def __init__(self, configs: List[patterns_pb2.StructuredWriterConfig]) -> None:
        self.configs = configs
        self.state = [{"applied": None, "checked": None, "since": 0} for _ in configs]
        ages = [abs(n.start if n.HasField("start") else n.stop) for c in configs for n in c.flat]
        self.max_history = max(ages)
        self.used = {n.flat_source_index for c in configs for n in c.flat}
        self.used |= {
            k.flat_source_index
            for c in configs
            for k in c.conditions
            if k.WhichOneof("left") == "flat_source_index"
        }
        self.steps: List[list] = []  # values of each step since the last clear
        self.episode, self.index, self.open = 0, 0, False
        self.current: Optional[Tuple[int, int]] = None
        self.items: Dict[str, list] = {t: [] for t in TABLES}

    def append(self, values: list, partial: bool) -> None:
        if self.open:
            for i, v in enumerate(values):
                if v is not None:
                    self.steps[-1][i] = v
        else:
            self.steps.append(list(values))
        step_id = (self.episode, self.index)
        has = any(self.steps[-1][i] is not None for i in self.used)
        self.current = step_id if has else None
        self.open = partial
        if not partial:
            self.index += 1
        self._apply(False)

    def end_episode(self, clear: bool) -> None:
        self._apply(True)
        self.episode, self.index, self.open = self.episode + 1, 0, False
        if clear:
            self.steps, self.current = [], None

    def _left(self, cond: Any, since: int, end: bool) -> Optional[int]:
        kind = cond.WhichOneof("left")
        if kind == "step_index":
            return self.current[1]
        if kind == "steps_since_applied":
            return since
        if kind == "buffer_length":
            return min(len(self.steps), self.max_history)
        if kind == "is_end_episode":
            return int(end)
        value = self.steps[-1][cond.flat_source_index]
        return None if value is None else int(value)

    @staticmethod
    def _holds(cond: Any, left: Optional[int]) -> bool:
        if left is None:
            return False
        kind = cond.WhichOneof("cmp")
        if kind == "eq":
            result = left == cond.eq
        elif kind == "ge":
            result = left >= cond.ge
        else:
            result = math.fmod(left, cond.mod_eq.mod) == cond.mod_eq.eq
        return result != cond.inverse

    def _take(self, node: Any) -> Optional[list]:
        n = len(self.steps)
        if abs(node.start if node.HasField("start") else node.stop) > n:
            return None
        if node.HasField("start"):
            stop = node.stop if node.HasField("stop") and node.stop != 0 else None
            step = node.step if node.HasField("step") else None
            rows = self.steps[node.start : stop : step]
        else:
            rows = [self.steps[node.stop]]
        values = [row[node.flat_source_index] for row in rows]
        return None if any(v is None for v in values) else values

    def _apply(self, end: bool) -> None:
        if self.current is None:
            return
        for config, state in zip(self.configs, self.state):
            if state["applied"] == self.current:
                continue
            if state["checked"] != self.current:
                state["since"] += 1
                state["checked"] = self.current
            if not all(
                self._holds(c, self._left(c, state["since"], end)) for c in config.conditions
            ):
                continue
            columns = [self._take(node) for node in config.flat]
            if any(c is None for c in columns):
                continue
            data = [
                col if node.HasField("start") else col[0] for node, col in zip(config.flat, columns)
            ]
            self.items[config.table].append([self._priority(config, columns), _flat(data)])
            state["applied"], state["since"] = self.current, 0

    @staticmethod
    def _priority(config: Any, columns: List[list]) -> float:
        if config.priority.WhichOneof("priority_fn") == "constant_fn":
            return config.priority.constant_fn.value
        td = config.priority.td_error
        held = [
            c for n, c in zip(config.flat, columns) if n.flat_source_index == td.flat_source_index
        ]
        if not held:
            return 0.0
        x = np.abs(np.asarray(held[-1], dtype=np.float64))
        w = td.max_priority_weight
        return float(w * x.max() + (1 - w) * x.mean())


@st.composite
def _node(draw: Any) -> patterns_pb2.PatternNode:
    leaf = draw(st.integers(0, 2))
    if draw(st.booleans()):
        return R[list(STEP)[leaf]][draw(st.integers(-4, -1))]
    start = draw(st.integers(-5, -1))
    stop = draw(st.integers(start + 1, 0))
    step = draw(st.sampled_from([None, 1, 2, 3]))
    return R[list(STEP)[leaf]][start : (stop or None) : step]


@st.composite
def _condition(draw: Any) -> patterns_pb2.Condition:
    kind = draw(st.sampled_from(["step_index", "steps_since_applied", "buffer_length", "data"]))
    left = {
        "step_index": C.step_index(),
        "steps_since_applied": C.steps_since_applied(),
        "buffer_length": sw._ConditionBuilder(patterns_pb2.Condition(buffer_length=True)),
        "data": C.data(STEP)[draw(st.sampled_from(["a", "c"]))],
    }[kind]
    op = draw(st.sampled_from(["==", "!=", ">=", ">", "<", "<=", "%"]))
    value = draw(st.integers(0, 4))
    if op == "%":
        return left % draw(st.integers(1, 3)) == draw(st.integers(0, 2))
    return {
        "==": lambda: left == value,
        "!=": lambda: left != value,
        ">=": lambda: left >= value,
        ">": lambda: left > value,
        "<": lambda: left < value,
        "<=": lambda: left <= value,
    }[op]()


@st.composite
def _config(draw: Any) -> patterns_pb2.StructuredWriterConfig:
    nodes = draw(st.lists(_node(), min_size=1, max_size=3))
    conditions = draw(st.lists(_condition(), max_size=2))
    if draw(st.booleans()):
        conditions.append(C.is_end_episode())
    priority = None
    if draw(st.booleans()):
        priority = sw.td_error(draw(st.sampled_from([0.0, 0.5, 1.0])), STEP, lambda s: s["a"])
    return sw.create_config(nodes, draw(st.sampled_from(TABLES)), conditions, priority)


@st.composite
def _script(draw: Any) -> List[Any]:
    ops: List[Any] = []
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(["append", "append", "append", "partial", "open", "end"]))
        if kind == "end":
            ops.append(("end", draw(st.booleans())))
            continue
        values = [
            None if draw(st.integers(0, 5)) == 0 else v
            for v in (
                np.int32(draw(st.integers(-3, 6))),
                np.float32(draw(st.integers(0, 9)) + 0.5),
                np.bool_(draw(st.booleans())),
            )
        ]
        first = [v if i == 0 else None for i, v in enumerate(values)]
        rest = [None if i == 0 else v for i, v in enumerate(values)]
        if kind == "partial":
            ops += [("append", first, True), ("append", rest, False)]
        elif kind == "open":  # a partial step still open when the episode ends
            ops += [("append", first, True), ("end", draw(st.booleans()))]
        else:
            ops.append(("append", values, False))
    return ops


@pytest.fixture(scope="module")
def queues():
    server = reverb.Server([reverb.Table.queue(t, 10_000) for t in TABLES])
    yield server
    server.stop()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(configs=st.lists(_config(), min_size=1, max_size=3), script=_script())
def test_random_configs_and_scripts_insert_what_the_model_says(queues, configs, script) -> None:
    client = queues.localhost_client()
    for table in TABLES:
        client.reset(table)
    model = _Model(configs)
    writer = client.structured_writer(configs)
    for op in script:
        if op[0] == "append":
            model.append(op[1], op[2])
            writer.append(dict(zip(STEP, op[1])), partial_step=op[2])
        else:
            model.end_episode(op[1])
            writer.end_episode(clear_buffers=op[1], timeout_ms=10_000)
    writer.flush(timeout_ms=10_000)
    got = {}
    for table in TABLES:
        n = client.server_info()[table].current_size
        samples = client.sample(table, n, emit_timesteps=False, timeout=10) if n else []
        got[table] = [[float(s.info.priority), _flat(s.data)] for s in samples]
    for table in TABLES:
        assert len(got[table]) == len(model.items[table]), (table, got, model.items)
        for (p, data), (want_p, want_data) in zip(got[table], model.items[table]):
            assert data == want_data
            assert p == pytest.approx(want_p)
    writer.close()


# Bad input.


def _queue_server(make_server, *tables: reverb.Table) -> reverb.Client:
    server = make_server(list(tables) or [reverb.Table.queue("q", 100)])
    return server.localhost_client()


def _node_of(**fields: int) -> patterns_pb2.PatternNode:
    return patterns_pb2.PatternNode(flat_source_index=0, **fields)


@pytest.mark.parametrize(
    "node, message",
    [
        (_node_of(start=-3, step=0), "`step` must be > 0 but got 0."),
        (_node_of(start=0), "`start` must be < 0 but got 0."),
        (_node_of(stop=1), "`stop` must be <= 0 but got 1."),
        (_node_of(stop=0), "`stop` must be < 0 when `start` isn't set but got 0."),
        (_node_of(start=-2, stop=-2), "`stop` (-2) must be > `start` (-2)"),
        (_node_of(), "At least one of `start` and `stop` must be specified."),
        (_node_of(stop=-1, step=2), "`step` must only be set when `start` is set."),
        (patterns_pb2.PatternNode(flat_source_index=-1, stop=-1), "must be >= 0 but got -1"),
    ],
)
def test_malformed_patterns_are_refused_when_the_writer_is_made(make_server, node, message) -> None:
    client = _queue_server(make_server)
    good = sw.create_config(R["a"][-1], "q")
    with pytest.raises(ValueError, match="Invalid configuration at position 1: ") as info:
        client.structured_writer([good, sw.create_config(node, "q")])
    assert message in str(info.value)


@pytest.mark.parametrize(
    "condition, message",
    [
        (
            patterns_pb2.Condition(
                step_index=True, mod_eq=patterns_pb2.Condition.ModuloEq(mod=0, eq=0)
            ),
            "`mod_eq.mod` must be > 0 but got 0.",
        ),
        (C.step_index() % 2 == -1, "`mod_eq.eq` must be >= 0 but got -1."),
        (patterns_pb2.Condition(eq=1), "Conditions must specify a value for `left`."),
        (patterns_pb2.Condition(step_index=True), "Conditions must specify a value for `cmp`."),
        (patterns_pb2.Condition(is_end_episode=True, eq=2), "must use `eq=1`"),
        (patterns_pb2.Condition(is_end_episode=True, eq=1, inverse=True), "must use `eq=1`"),
    ],
)
def test_malformed_conditions_are_refused_when_the_writer_is_made(
    make_server, condition, message
) -> None:
    client = _queue_server(make_server)
    with pytest.raises(ValueError, match="Invalid configuration at position 0: ") as info:
        client.structured_writer([sw.create_config(R["a"][-1], "q", [condition])])
    assert message in str(info.value)


def test_leaf_indices_are_bounded(make_server) -> None:
    client = _queue_server(make_server)
    huge = patterns_pb2.PatternNode(flat_source_index=2**31 - 1, stop=-1)
    with pytest.raises(ValueError, match="must be < 65536"):
        client.structured_writer([sw.create_config(huge, "q")])
    condition = patterns_pb2.Condition(flat_source_index=2**31 - 1, eq=1)
    with pytest.raises(ValueError, match="must be < 65536"):
        client.structured_writer([sw.create_config(R["a"][-1], "q", [condition])])


def test_configs_without_table_nodes_or_priority_are_refused(make_server) -> None:
    client = _queue_server(make_server)
    with pytest.raises(ValueError, match="At least one config must be provided"):
        client.structured_writer([])
    with pytest.raises(ValueError, match="`table` must not be empty"):
        client.structured_writer([sw.create_config(R["a"][-1], "")])
    with pytest.raises(ValueError, match="`flat` must not be empty"):
        client.structured_writer([sw.create_config([], "q")])
    no_priority = patterns_pb2.StructuredWriterConfig(flat=[R["a"][-1]], table="q")
    with pytest.raises(ValueError, match="`priority` must be set"):
        client.structured_writer([no_priority])
    with pytest.raises(ValueError, match="expected a StructuredWriterConfig"):
        client.structured_writer(["not a config"])  # type: ignore[list-item]


def _size(client: reverb.Client, table: str = "q") -> int:
    return client.server_info(timeout=10)[table].current_size


def test_unknown_tables_and_missing_leaves_fail_the_first_append_and_nothing_else(
    make_server,
) -> None:
    client = _queue_server(make_server)
    writer = client.structured_writer([sw.create_config(R["a"][-1], "nope")])
    with pytest.raises(ValueError, match="Config 0 inserts into table 'nope'.*tables: \\[q\\]"):
        writer.append({"a": 1})
    writer = client.structured_writer([sw.create_config(R["c"][-1], "q")])
    with pytest.raises(ValueError, match="Config 0 refers to leaf 2 .* steps have 1 leaves"):
        writer.append({"a": 1})
    # A good writer on the same server is unaffected.
    with client.structured_writer([sw.create_config(R["a"][-1], "q")]) as good:
        good.append({"a": 1, "b": 2, "c": 3})
    assert _size(client) == 1


def test_a_config_for_an_unknown_table_fails_each_append_it_applies_to_and_no_other(
    make_server,
) -> None:
    """The other configs go on: their items are stored, and flush has nothing to report."""
    client = _queue_server(make_server)
    configs = [sw.create_config(R["a"][-1], "q"), sw.create_config(R["b"][-1], "nope")]
    with client.structured_writer(configs) as writer:
        for step in range(3):
            with pytest.raises(ValueError, match="Config 1 inserts into table 'nope'"):
                writer.append({"a": step, "b": step, "c": step})
        writer.append({"a": 3, "b": None, "c": 3})  # config 1 does not apply: no error
        writer.flush(timeout_ms=10_000)
    assert _size(client) == 4


def test_steps_must_keep_their_length_dtypes_and_shapes(make_server) -> None:
    client = _queue_server(make_server)
    writer = client.structured_writer([sw.create_config(R["b"][-2:], "q")])
    writer.append({"a": 1, "b": np.zeros(2, np.float32), "c": 1})
    with pytest.raises(ValueError, match="unexpected length, got 2 but wanted 3"):
        writer.append({"a": 1, "b": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=r"wrong dtype .*column 1 \(path=\('b',\)\).*int64"):
        writer.append({"a": 1, "b": np.zeros(2, np.int64), "c": 1})
    with pytest.raises(ValueError, match=r"incompatible shape .*\(path=\('b',\)\)\. Got \[3\]"):
        writer.append({"a": 1, "b": np.zeros(3, np.float32), "c": 1})
    # Refused appends changed nothing: the next good step makes the item of the two good ones.
    writer.append({"a": 1, "b": np.ones(2, np.float32), "c": 1})
    writer.flush(timeout_ms=10_000)
    (sample,) = client.sample("q", 1, emit_timesteps=False, timeout=10)
    np.testing.assert_array_equal(sample.data[0], [[0, 0], [1, 1]])


def test_a_leaf_set_twice_in_one_step_is_refused(make_server) -> None:
    client = _queue_server(make_server)
    writer = client.structured_writer([sw.create_config(R["a"][-1], "q", [C.data(STEP)["c"] == 1])])
    writer.append({"a": 1, "b": None, "c": None}, partial_step=True)
    assert writer.step_is_open
    with pytest.raises(ValueError, match=r"column 0 \(path=\('a',\)\) has already been set"):
        writer.append({"a": 2, "b": None, "c": None}, partial_step=True)
    writer.append({"a": None, "b": None, "c": True})
    with pytest.raises(ValueError, match=r"column 2 \(path=\('c',\)\) has already been set"):
        writer.append({"a": None, "b": None, "c": True}, partial_step=True)
        writer.append({"a": None, "b": None, "c": True})
    writer.flush(timeout_ms=10_000)
    assert _size(client) == 1


def test_data_conditions_and_td_errors_need_scalars(make_server) -> None:
    client = _queue_server(make_server)
    writer = client.structured_writer([sw.create_config(R["a"][-1], "q", [C.data(STEP)["b"] == 1])])
    with pytest.raises(ValueError, match="data condition on leaf 1 .* got float32\\[\\]"):
        writer.append({"a": 1, "b": np.float32(1), "c": 1})
    writer = client.structured_writer(
        [sw.create_config(R["b"][-1], "q", priority=sw.td_error(0.5, STEP, lambda s: s["b"]))]
    )
    with pytest.raises(ValueError, match="TD Error expects a scalar tensor.*float32\\[2\\]"):
        writer.append({"a": 1, "b": np.zeros(2, np.float32), "c": 1})
    assert _size(client) == 0


def test_items_must_match_the_table_signature(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    signature = {"obs": tf.TensorSpec([2, 3], tf.float32), "act": tf.TensorSpec([], tf.int32)}
    client = _queue_server(make_server, reverb.Table.queue("q", 100, signature=signature))
    step = {"obs": None, "act": None}
    ref = sw.create_reference_step(step)
    bad = sw.create_config({"obs": ref["obs"][-2:], "act": ref["act"][-2:]}, "q")
    writer = client.structured_writer([bad])
    writer.append({"obs": np.zeros(3, np.float32), "act": np.int32(0)})
    with pytest.raises(ValueError) as info:
        writer.append({"obs": np.zeros(3, np.float32), "act": np.int32(1)})
    message = str(info.value)
    assert "table 'q' from config 0" in message
    assert "('act',) (leaf 0 of the step) is int32[2]" in message and "int32[]" in message
    good = sw.create_config({"obs": ref["obs"][-2:], "act": ref["act"][-1]}, "q")
    with client.structured_writer([good]) as writer:
        for i in range(3):
            writer.append({"obs": np.full(3, i, np.float32), "act": np.int32(i)})
    assert _size(client) == 2
    sample = next(iter(client.sample("q", 1, emit_timesteps=False, timeout=10)))
    act, obs = sample.data  # flattened as the signature: act, obs
    assert act == 1
    np.testing.assert_array_equal(obs, [[0, 0, 0], [1, 1, 1]])


def test_a_config_that_cannot_make_its_item_stops_no_other(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    client = _queue_server(
        make_server,
        reverb.Table.queue("q", 100, signature=tf.TensorSpec([], tf.float32)),
        reverb.Table.queue("r", 100),
    )
    configs = [
        sw.create_config(R["a"][-1], "q", [C.is_end_episode()]),  # int32 into a float32 table
        sw.create_config(R["a"][-1], "r", [C.step_index() == 0]),
    ]
    writer = client.structured_writer(configs)
    for episode in range(3):
        writer.append({"a": np.int32(episode)})
        with pytest.raises(ValueError, match="config 0: .*The step itself was appended"):
            writer.end_episode(timeout_ms=10_000)
    writer.flush(timeout_ms=10_000)
    # Every episode ended (step_index 0 came three times) and the other config inserted.
    assert _size(client, "r") == 3 and _size(client, "q") == 0
    got = [int(s.data[0]) for s in client.sample("r", 3, emit_timesteps=False, timeout=10)]
    assert got == [0, 1, 2]


def test_flush_and_end_episode_time_out_on_a_full_table(make_server) -> None:
    client = _queue_server(make_server, reverb.Table.queue("q", 1))
    writer = client.structured_writer([sw.create_config(R["a"][-1], "q")])
    writer.append({"a": 1})
    writer.append({"a": 2})  # the queue holds one: this item waits
    with pytest.raises(reverb.errors.DeadlineExceededError):
        writer.flush(timeout_ms=300)
    with pytest.raises(reverb.errors.DeadlineExceededError):
        writer.end_episode(timeout_ms=300)
    with pytest.raises(ValueError, match="block_until_num_items must be >= 0"):
        writer.flush(-1)
    assert _size(client) == 1
    writer.close()


def test_structured_writing_works_without_tensorflow() -> None:
    result = run_without_tensorflow(
        """
        import numpy as np, reverb
        from reverb import structured_writer as sw
        server = reverb.Server([reverb.Table.queue("q", 10)])
        client = server.localhost_client()
        ref = sw.create_reference_step({"x": None})
        config = sw.create_config(ref["x"][-2:], "q", [sw.Condition.step_index() % 2 == 1])
        with client.structured_writer([config]) as writer:
            for i in range(4):
                writer.append({"x": np.int64(i)})
        got = [s.data[0].tolist() for s in client.sample("q", 2, emit_timesteps=False)]
        assert got == [[0, 1], [2, 3]], got
        server.stop()
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"


def test_a_table_observed_after_each_step_grows_by_one_item_per_step(make_server) -> None:
    """Items of a structured writer stepping at an environment's pace reach the server
    without waiting for later appends."""
    client = _queue_server(make_server)
    ref = sw.create_reference_step({"o": np.float32(0)})
    config = sw.create_config(sw.pattern_from_transform(ref, lambda s: s["o"][-2:]), "q")
    with client.structured_writer([config]) as writer:
        for step in range(5):
            writer.append({"o": np.float32(step)})
            wait_for(
                lambda step=step: client.server_info(timeout=10)["q"].current_size == step,
                10,
                f"{step} items after step {step}",
            )
