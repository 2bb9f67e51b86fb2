"""`PatternDataset`: structured-writer configs applied to a `tf.data` stream of steps, without
a server. Each input element is one step; the output has the trajectories a
`StructuredWriter` with the same configs would insert, in the order it would insert them.

A `scan` keeps each leaf's recent rows in a fixed-size buffer and asks the kernel
`ReverbRsPatternStep` which configs apply on each step: it runs the structured writer's own
rule (in Rust, `reverb_client::writer::schedule`), so the conditions are evaluated by one
implementation. Runs in eager mode, in `tf.function`s and in TF1 graphs.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from reverb import _native, _tf_ops, replay_sample, structured_writer
from reverb.cc import patterns_pb2


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
    """The per-step work of the dataset as TensorFlow ops: rows kept per leaf, the kernel's
    decision, the trajectories cut out of the rows."""

    def __init__(
        self,
        configs: Sequence[patterns_pb2.StructuredWriterConfig],
        step_spec: Any,
        respect_episode_boundaries: bool,
    ) -> None:
        self.flat_spec = tf.nest.flatten(step_spec)
        serialized = [c.SerializeToString() for c in configs]
        schedule = _native.PatternSchedule(
            serialized, len(self.flat_spec), bool(respect_episode_boundaries)
        )
        self.count = len(schedule)
        self.state_len = schedule.state_len
        # Rows kept per leaf trajectories take, and where each config's columns lie in them.
        self.history = schedule.history
        self.slices = [schedule.slices(c) for c in range(self.count)]
        self.data_leaves = schedule.data_leaves
        self.op_attrs = {
            "configs": serialized,
            "num_leaves": len(self.flat_spec),
            "respect_episode_boundaries": bool(respect_episode_boundaries),
        }
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
        return (
            buffers,
            tf.zeros([self.state_len], tf.int64),  # the kernel's state
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

    def _one_shape(self, c: int, rows: dict) -> Any:
        """Whether, for each dynamic leaf config `c`'s trajectory reads, the rows from the
        oldest it takes to the newest share a shape (a buffer keeps only those)."""
        ok = [
            rows[leaf] >= self.history[leaf] - first
            for leaf, first, _, _, _ in self.slices[c]
            if leaf in rows
        ]
        return tf.reduce_all(tf.stack(ok)) if ok else tf.constant(True)

    def trajectory(self, c: int, buffers: dict) -> list:
        out = []
        for leaf, first, length, step, squeeze in self.slices[c]:
            buffer = buffers[leaf]
            out.append(buffer[first] if squeeze else buffer[first : first + length : step])
        return out

    def step(self, state: tuple, flat: list, end_of_episode: Any) -> tuple:
        buffers, schedule, rows = state
        rows = dict(rows)
        buffers = {
            leaf: self._push(leaf, buffer, flat[leaf], rows) for leaf, buffer in buffers.items()
        }
        made, schedule = _tf_ops.ops().reverb_rs_pattern_step(
            state=schedule,
            end_of_episode=end_of_episode,
            data=[flat[leaf] for leaf in self.data_leaves],
            **self.op_attrs,
        )
        made.set_shape([2 * self.count])
        schedule.set_shape([self.state_len])
        if rows:
            n = self.count
            any_applied = tf.logical_or(made[:n], made[n:])
            one_shape = tf.stack([self._one_shape(c, rows) for c in range(n)])
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
        trajectories = tuple(tuple(self.trajectory(c, buffers)) for c in range(self.count))
        return (buffers, schedule, rows), (made, trajectories)


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
        program = _Program(configs, input_dataset.element_spec, respect_episode_boundaries)
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
            return program.step(state, flat, end)

        structure = self._structure
        flat_specs = tf.nest.flatten(structure)

        count = program.count

        def stack(made: Any, trajectories: tuple) -> tuple:
            """The step's trajectories as one batch (unbatched next): per leaf, the configs'
            tensors padded to one shape and stacked, gathered in the order they are made
            (each config's trajectory on the step, then at the end of the episode), with
            their shapes where configs differ in them."""
            made_in_order = tf.cast(tf.where(made)[:, 0] % count, tf.int32)
            out = []
            for j in range(len(flat_specs)):
                parts = [trajectories[c][j] for c in range(count)]
                static = {tuple(p.shape.as_list()) for p in parts}
                if len(static) == 1 and None not in next(iter(static)):
                    out.append((tf.gather(tf.stack(parts), made_in_order),))
                    continue
                shapes = tf.stack([tf.shape(p, out_type=tf.int64) for p in parts])
                top = tf.reduce_max(shapes, axis=0)
                padded = [
                    tf.pad(p, tf.stack([tf.zeros_like(top), top - shapes[c]], axis=1))
                    for c, p in enumerate(parts)
                ]
                out.append(
                    (tf.gather(tf.stack(padded), made_in_order), tf.gather(shapes, made_in_order))
                )
            return tuple(out)

        def unpad(*leaves: Any) -> Any:
            flat = []
            for leaf, spec in zip(leaves, flat_specs):
                t = leaf[0]
                if len(leaf) == 2:  # the leaf's shape differs between configs
                    t = tf.slice(t, tf.zeros_like(leaf[1]), leaf[1])
                t.set_shape(spec.shape)
                flat.append(t)
            return tf.nest.pack_sequence_as(structure, flat)

        ds = input_dataset.scan(program.initial_state(), scan_fn)
        ds = ds.map(stack).unbatch().map(unpad)
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
