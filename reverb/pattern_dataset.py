"""`PatternDataset`: structured-writer configs applied to a `tf.data` stream of steps, without
a server. Each input element is one step; the output has the trajectories a
`StructuredWriter` with the same configs would insert, in the order it would insert them.

Built from `tf.data` transformations only (a `scan` keeps each used leaf's recent steps in a
fixed-size buffer and evaluates every config's conditions per step), so it runs in eager
mode, in `tf.function`s and in TF1 graphs, with any TensorFlow version.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, List, Sequence

import tensorflow as tf

from reverb import replay_sample, structured_writer
from reverb.cc import patterns_pb2


def _max_age(node: patterns_pb2.PatternNode) -> int:
    return abs(node.start if node.HasField("start") else node.stop)


def _with_buffer_conditions(
    configs: Sequence[patterns_pb2.StructuredWriterConfig],
) -> List[patterns_pb2.StructuredWriterConfig]:
    """Copies of `configs` that each require the buffer to hold their history, as the
    reference adds them (its history length grows over the configs, in order)."""
    history = 0
    out = []
    for config in configs:
        config = copy.deepcopy(config)
        for node in config.flat:
            history = max(history, abs(min(node.start, node.stop)))
            if not any(c.buffer_length and c.ge >= history for c in config.conditions):
                config.conditions.append(patterns_pb2.Condition(buffer_length=True, ge=history))
        out.append(config)
    return out


def _lists_to_tuples(structure: Any) -> Any:
    if isinstance(structure, list):
        return tuple(_lists_to_tuples(x) for x in structure)
    if isinstance(structure, tuple) and not hasattr(structure, "_fields"):
        return tuple(_lists_to_tuples(x) for x in structure)
    if isinstance(structure, tuple):
        return type(structure)(*[_lists_to_tuples(x) for x in structure])
    if isinstance(structure, dict):
        return {k: _lists_to_tuples(v) for k, v in structure.items()}
    return structure


class _Program:
    """The per-step evaluation of the configs, as TensorFlow ops."""

    def __init__(self, configs: List[patterns_pb2.StructuredWriterConfig], step_spec: Any):
        self.configs = configs
        self.flat_spec = tf.nest.flatten(step_spec)
        # Steps of history each used leaf keeps (data conditions read the newest step only).
        self.history: dict = {}
        for c, config in enumerate(configs):
            if not config.flat:
                raise ValueError(
                    f"Invalid configuration at position {c}: `flat` must not be empty."
                )
            leaves = [n.flat_source_index for n in config.flat]
            leaves += [
                k.flat_source_index
                for k in config.conditions
                if k.WhichOneof("left") == "flat_source_index"
            ]
            for leaf in leaves:
                if not 0 <= leaf < len(self.flat_spec):
                    raise ValueError(
                        f"Config {c} refers to leaf {leaf} (`flat_source_index`) but the steps "
                        f"have {len(self.flat_spec)} leaves."
                    )
            for node in config.flat:
                age = _max_age(node)
                if age < 1 or (node.HasField("step") and node.step < 1):
                    raise ValueError(f"Invalid configuration at position {c}: bad node {node}")
                self.history[node.flat_source_index] = max(
                    self.history.get(node.flat_source_index, 0), age
                )
            for k in config.conditions:
                if k.WhichOneof("left") == "flat_source_index":
                    self.history.setdefault(k.flat_source_index, 1)
        self.max_history = max(max(self.history.values()), 1)
        # Leaves whose shape is not fully defined: their rows may change shape from step to
        # step, so their buffers are refilled when it does, and a trajectory may not span
        # rows of two shapes (its tensors could not be stacked).
        self.dynamic = [i for i in self.history if not self.flat_spec[i].shape.is_fully_defined()]
        for i in self.dynamic:
            if self.flat_spec[i].shape.rank is None:
                raise ValueError(
                    f"PatternDataset needs the rank of the leaves configs read; leaf {i} of "
                    f"the step has shape {self.flat_spec[i].shape}."
                )

    def initial_state(self) -> tuple:
        buffers = {
            leaf: tf.zeros(
                [h, *(d if d is not None else 0 for d in self.flat_spec[leaf].shape.as_list())],
                self.flat_spec[leaf].dtype,
            )
            for leaf, h in self.history.items()
        }
        n = len(self.configs)
        return (
            buffers,
            tf.constant(0, tf.int64),  # rows held since the buffers were cleared
            tf.constant(0, tf.int64),  # index of the next step in its episode
            tf.zeros([n], tf.int64),  # steps since each config applied
            # Per dynamic leaf: its newest rows that have the newest row's shape.
            {leaf: tf.constant(0, tf.int64) for leaf in self.dynamic},
        )

    def _push(self, leaf: int, buffer: Any, row: Any, rows: dict) -> Any:
        """`buffer` without its oldest row and with `row`; a dynamic leaf's buffer starts
        over (zeros of the row's shape) when the row's shape differs from the buffer's."""
        if leaf not in rows:
            return tf.concat([buffer[1:], row[None]], axis=0)
        h = self.history[leaf]
        same = tf.reduce_all(tf.equal(tf.shape(buffer)[1:], tf.shape(row)))
        rows[leaf] = tf.where(same, tf.minimum(rows[leaf] + 1, h), tf.constant(1, tf.int64))
        return tf.cond(
            same,
            lambda: tf.concat([buffer[1:], row[None]], axis=0),
            lambda: tf.concat(
                [tf.zeros(tf.concat([[h - 1], tf.shape(row)], 0), row.dtype), row[None]], 0
            ),
        )

    def _one_shape(self, config: Any, rows: dict) -> Any:
        """Whether, for each dynamic leaf a trajectory of `config` reads, the rows from the
        oldest it takes to the newest share a shape (a buffer keeps only those)."""
        ok = [
            rows[n.flat_source_index] >= _max_age(n)
            for n in config.flat
            if n.flat_source_index in rows
        ]
        return tf.reduce_all(tf.stack(ok)) if ok else tf.constant(True)

    def _left(self, cond: Any, buffers: dict, held: Any, index: Any, since: Any, end: bool) -> Any:
        kind = cond.WhichOneof("left")
        if kind == "step_index":
            return index
        if kind == "steps_since_applied":
            return since
        if kind == "buffer_length":
            return held
        if kind == "is_end_episode":
            return tf.constant(int(end), tf.int64)
        value = buffers[cond.flat_source_index][-1]
        if not (value.dtype.is_integer or value.dtype == tf.bool):
            return None  # the reference's condition on such a leaf is never true
        valid = None
        if cond.flat_source_index in self.dynamic:
            # Known at run time only: a row of one element holds a value, others never do.
            valid = tf.equal(tf.size(value), 1)
            value = tf.reshape(value, [-1])
            value = tf.cond(valid, lambda: value[0], lambda: tf.zeros([], value.dtype))
        elif value.shape.num_elements() != 1:
            return None
        else:
            value = tf.reshape(value, [])
        if value.dtype == tf.bool:
            value = tf.cast(value, tf.int64)
        else:
            # Compared as a 32-bit integer, as the reference does.
            value = tf.cast(tf.cast(value, tf.int32), tf.int64)
        return value if valid is None else (value, valid)

    def _holds(self, cond: Any, left: Any) -> Any:
        """Whether `cond` holds for `left` (what `_left` gave: None never holds; a
        `(value, valid)` pair holds only where `valid`)."""
        if left is None:
            return tf.constant(False)
        valid = None
        if isinstance(left, tuple):
            left, valid = left
        kind = cond.WhichOneof("cmp")
        if kind == "eq":
            result = tf.equal(left, cond.eq)
        elif kind == "ge":
            result = tf.greater_equal(left, cond.ge)
        elif kind == "mod_eq":
            # The remainder with the dividend's sign, as in C++.
            result = tf.equal(tf.truncatemod(left, cond.mod_eq.mod), cond.mod_eq.eq)
        else:
            raise ValueError(f"Condition {cond} has no comparison (`cmp`).")
        result = tf.logical_not(result) if cond.inverse else result
        return result if valid is None else tf.logical_and(valid, result)

    def trajectory(self, config: Any, buffers: dict) -> list:
        out = []
        for node in config.flat:
            buffer = buffers[node.flat_source_index]
            h = self.history[node.flat_source_index]
            if node.HasField("start"):
                stop = h + node.stop if node.HasField("stop") else h
                step = node.step if node.HasField("step") else 1
                out.append(buffer[h + node.start : stop : step])
            else:
                out.append(buffer[h + node.stop])
        return out

    def step(self, state: tuple, flat: list, end_of_episode: Any, clear: bool) -> tuple:
        buffers, held, index, since, rows = state
        rows = dict(rows)
        buffers = {
            leaf: self._push(leaf, buffer, flat[leaf], rows) for leaf, buffer in buffers.items()
        }
        held = tf.minimum(held + 1, self.max_history)
        since = since + 1
        applied, trajectories = [], []
        for c, config in enumerate(self.configs):
            enough = held >= max(_max_age(n) for n in config.flat)
            ok = [enough] + [
                self._holds(k, self._left(k, buffers, held, index, since[c], False))
                for k in config.conditions
            ]
            applied.append(tf.reduce_all(tf.stack(ok)))
            trajectories.append(tuple(self.trajectory(config, buffers)))
        at_end = []
        for c, config in enumerate(self.configs):
            since_c = tf.where(applied[c], tf.constant(0, tf.int64), since[c])
            enough = held >= max(_max_age(n) for n in config.flat)
            ok = [enough, end_of_episode, tf.logical_not(applied[c])] + [
                self._holds(k, self._left(k, buffers, held, index, since_c, True))
                for k in config.conditions
            ]
            at_end.append(tf.reduce_all(tf.stack(ok)))
        made = tf.stack(applied + at_end)
        any_applied = tf.logical_or(tf.stack(applied), tf.stack(at_end))
        if rows:
            one_shape = tf.stack([self._one_shape(config, rows) for config in self.configs])
            check = tf.debugging.Assert(
                tf.reduce_all(tf.logical_or(tf.logical_not(any_applied), one_shape)),
                [
                    "PatternDataset: a trajectory reads a leaf of undefined shape whose rows "
                    "have different shapes between the oldest step it takes and the newest "
                    "step (rows are kept only since the last change of shape)"
                ],
            )
            with tf.control_dependencies([check]):
                made = tf.identity(made)
        since = tf.where(any_applied, tf.zeros_like(since), since)
        index = tf.where(end_of_episode, tf.constant(0, tf.int64), index + 1)
        if clear:
            held = tf.where(end_of_episode, tf.constant(0, tf.int64), held)
        return (buffers, held, index, since, rows), (made, tuple(trajectories))


class PatternDataset(tf.data.Dataset):
    """A `tf.data.Dataset` of the trajectories `configs` make from `input_dataset`'s steps.

    Args:
      input_dataset: a dataset of steps (flatten a dataset of episodes first).
      configs: structured-writer configs; they must make trajectories of one structure
        (`infer_signature` checks them).
      respect_episode_boundaries: if True, no trajectory spans two episodes.
      is_end_of_episode: maps a step to a scalar `tf.bool`, true on an episode's last step
        (end-of-episode configs apply there).
    """

    def __init__(
        self,
        input_dataset: tf.data.Dataset,
        configs: Sequence[patterns_pb2.StructuredWriterConfig],
        respect_episode_boundaries: bool,
        is_end_of_episode: Callable[[Any], Any],
    ) -> None:
        signature = structured_writer.infer_signature(configs, input_dataset.element_spec)
        self._structure = _lists_to_tuples(signature)
        configs = _with_buffer_conditions(configs)
        program = _Program(configs, input_dataset.element_spec)
        step_structure = input_dataset.element_spec

        def is_end(step: Any) -> Any:
            # Called as tf.data calls a map function: a tuple step is unpacked.
            if type(step) is tuple:
                result = is_end_of_episode(*step)
            else:
                result = is_end_of_episode(step)
            result = tf.convert_to_tensor(result)
            if result.dtype != tf.bool or result.shape.rank not in (0, None):
                raise ValueError(
                    "Invalid `is_end_of_episode`. `is_end_of_episode` must return `bool`, but "
                    f"its return type is {tf.TensorSpec(result.shape, result.dtype)}."
                )
            return tf.reshape(result, [])

        def scan_fn(state: tuple, step: Any) -> tuple:
            flat = tf.nest.flatten(step)
            end = is_end(tf.nest.pack_sequence_as(step_structure, flat))
            return program.step(state, flat, end, bool(respect_episode_boundaries))

        structure = self._structure
        flat_specs = tf.nest.flatten(structure)

        def emit(made: Any, trajectories: tuple) -> tf.data.Dataset:
            candidates = list(trajectories) + list(trajectories)
            out = None
            for k, trajectory in enumerate(candidates):
                data = tf.nest.pack_sequence_as(structure, list(trajectory))
                ds = tf.data.Dataset.from_tensors(data).repeat(tf.cast(made[k], tf.int64))
                out = ds if out is None else out.concatenate(ds)
            return out

        def set_shapes(*args: Any) -> Any:
            # tf.data passes a tuple element's parts as separate arguments.
            data = args if type(structure) is tuple else args[0]
            flat = tf.nest.flatten(data)
            for t, spec in zip(flat, flat_specs):
                t.set_shape(spec.shape)
            return tf.nest.pack_sequence_as(structure, flat)

        ds = input_dataset.scan(program.initial_state(), scan_fn)
        ds = ds.flat_map(emit).map(set_shapes)
        cardinality = tf.get_static_value(input_dataset.cardinality())
        if cardinality is not None and cardinality == tf.data.INFINITE_CARDINALITY:
            # An endless stream of steps makes an endless stream of trajectories.
            ds = ds.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
        self._dataset = ds
        super().__init__(ds._variant_tensor)

    def _inputs(self) -> list:
        return [self._dataset]

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec


def pattern_dataset_with_info(
    input_dataset: tf.data.Dataset,
    configs: Sequence[patterns_pb2.StructuredWriterConfig],
    respect_episode_boundaries: bool,
    is_end_of_episode: Callable[[Any], Any],
) -> tf.data.Dataset:
    """`PatternDataset` whose elements are `ReplaySample`s with an all-zero `SampleInfo`."""
    dataset = PatternDataset(input_dataset, configs, respect_episode_boundaries, is_end_of_episode)
    tuple_elements = type(dataset.element_spec) is tuple

    def with_info(*args: Any) -> replay_sample.ReplaySample:
        data = args if tuple_elements else args[0]
        return replay_sample.ReplaySample(info=replay_sample.SampleInfo.zeros(), data=data)

    return dataset.map(with_info)
