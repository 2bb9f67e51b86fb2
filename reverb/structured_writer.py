"""Structured writing (`reverb.structured_writer`, also `reverb.structured`): a
`StructuredWriter` (`Client.structured_writer(configs)`) appends steps and inserts items as
static configs say, which slices of the step history become an item of which table, and when.

A *pattern* is a nest of `PatternNode`s, each taking a leaf of the appended steps (by its
index in the flattened step) at positions counted back from the newest step: build them by
indexing a reference step (`create_reference_step(step)["obs"][-3:]`). A *config*
(`StructuredWriterConfig`) adds the table, a priority and conditions (`Condition`), which
must all hold after a step for the config to apply. The writer evaluates configs natively
after every append. Everything here works without TensorFlow except `infer_signature`, which
returns `tf.TensorSpec`s.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, List, NewType, Optional, Sequence

from reverb import _dtypes, _native, _nest, _structure
from reverb.cc import patterns_pb2

Config = patterns_pb2.StructuredWriterConfig
ConditionProto = patterns_pb2.Condition

Pattern = Any  # a nest of patterns_pb2.PatternNode
ReferenceStep = NewType("ReferenceStep", object)
PatternTransform = Callable[[ReferenceStep], Pattern]


class StructuredWriter:
    """Appends steps and inserts the items its configs make from them. Build it with
    `Client.structured_writer(configs)`.

    Every step must flatten to the same number of leaves; a leaf may be `None` (no value in
    that step: patterns taking that step of that leaf do not apply). After each `append` (and
    in `end_episode`) every config whose conditions all hold inserts its pattern, at most once
    per step. Calls from several threads are serialized.
    """

    def __init__(self, internal_writer: _native.StructuredWriter) -> None:
        self._writer = internal_writer
        self._structure: Any = None
        self._length: Optional[int] = None
        # The structure of the last step flattened in Python (later steps of that
        # structure with plain leaves are flattened natively).
        self._layout: Optional[_native.StepLayout] = None

    def _flatten(self, data: Any) -> List[Any]:
        if self._layout is not None:
            flat = self._layout.flatten(data)
            if flat is not None:
                return flat
        flat = _nest.flatten(data)
        if self._length is None:
            self._length = len(flat)
            self._structure = _nest.map_structure(lambda _: None, data)
        if len(flat) != self._length:
            raise ValueError(
                f"Flattened data has an unexpected length, got {len(flat)} but wanted "
                f"{self._length}."
            )
        self._layout = _native.StepLayout.of(data, list(range(len(flat))))
        return flat

    def _path(self, index: int) -> Any:
        return _nest.flatten_with_path(self._structure)[index][0]

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Appends a step: a nest of array-likes (or `None`s) with the structure of every
        other step. With `partial_step` the step stays open and a later call fills in the
        leaves this one left `None` (each leaf at most once per step). ValueError if the
        flattened length changes or a leaf's dtype or shape does."""
        error = self._writer.append(self._flatten(data), partial_step)
        if error is None:
            return
        path = self._path(error.column)
        if error.already_set:
            raise ValueError(
                f"A value for column {error.column} (path={path}) has already been set in the "
                "active step by a previous (partial) append call."
            )
        (want_dtype, want_shape), (got_dtype, got_shape) = error.expected, error.got
        if want_dtype != got_dtype:
            raise ValueError(
                f"Tensor of wrong dtype provided for column {error.column} (path={path}). Got "
                f"{_native.tf_dtype_name(got_dtype)} but expected "
                f"{_native.tf_dtype_name(want_dtype)}."
            )
        raise ValueError(
            f"Tensor of incompatible shape provided for column {error.column} (path={path}). "
            f"Got {_dtypes.shape_string(got_shape)} which is incompatible with "
            f"{_dtypes.shape_string(want_shape)}."
        )

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        """Sends every inserted item and blocks until at most `block_until_num_items` are
        unconfirmed by the server. DeadlineExceededError after `timeout_ms` (the items are
        still sent)."""
        if block_until_num_items < 0:
            raise ValueError(f"block_until_num_items must be >= 0, got {block_until_num_items}")
        self._writer.flush(block_until_num_items, timeout_ms)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None) -> None:
        """Applies the configs that hold at the end of an episode (`Condition.is_end_episode`),
        starts a new episode and waits until every item is confirmed. `clear_buffers=False`
        keeps the history, for items that span episodes. DeadlineExceededError after
        `timeout_ms` (the new episode has begun all the same)."""
        self._writer.end_episode(clear_buffers, timeout_ms)

    @property
    def step_is_open(self) -> bool:
        """True if the last `append` had `partial_step` set."""
        return bool(self._writer.step_is_open)

    def close(self) -> None:
        """Stops the writer. Items that were not flushed may be lost."""
        self._writer.close()

    def __enter__(self) -> StructuredWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is None:
            self.flush()
        self.close()


class _RefNode:
    """A leaf of a reference step: indexing it (`[-1]`, `[-3:]`, `[-8::2]`) makes a
    `PatternNode` of that leaf."""

    __slots__ = ("_index",)

    def __init__(self, index: int) -> None:
        self._index = index

    def __getitem__(self, key: Any) -> patterns_pb2.PatternNode:
        if isinstance(key, bool) or not isinstance(key, (int, slice)):
            raise ValueError(f"Key must be an int or a slice, got {key!r} (type {type(key)})")
        if isinstance(key, int):
            return patterns_pb2.PatternNode(flat_source_index=self._index, stop=key)
        return patterns_pb2.PatternNode(
            flat_source_index=self._index, start=key.start, stop=key.stop, step=key.step
        )

    def __repr__(self) -> str:
        return f"RefNode({self._index})"


def create_reference_step(step_structure: Any) -> ReferenceStep:
    """A nest like `step_structure` (the structure of what will be appended) whose leaves
    build `PatternNode`s when indexed."""
    count = len(_nest.flatten(step_structure))
    return ReferenceStep(
        _nest.pack_sequence_as(step_structure, [_RefNode(i) for i in range(count)])
    )


def pattern_from_transform(step_structure: Any, transform: PatternTransform) -> Pattern:
    """The pattern `transform` makes from a reference step of `step_structure`."""
    return transform(create_reference_step(step_structure))


def constant_priority_fn(value: float) -> patterns_pb2.Priority:
    """Every item of the config gets priority `value`."""
    return patterns_pb2.Priority(constant_fn=patterns_pb2.Priority.ConstantPriorityFn(value=value))


def td_error(
    max_priority_weight: float,
    step_structure: Any,
    get_field_from_step_fn: Callable[[Any], Any],
) -> patterns_pb2.Priority:
    """Priorities from a TD-error leaf of the steps: `get_field_from_step_fn` picks the leaf
    from a step of `step_structure`; an item's priority is
    `w * max(|td|) + (1 - w) * mean(|td|)` over its steps, with `w = max_priority_weight`."""
    count = len(_nest.flatten(step_structure))
    indices = _nest.pack_sequence_as(step_structure, list(range(count)))
    index = get_field_from_step_fn(indices)
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"get_field_from_step_fn must pick one leaf of the step, got {index!r}")
    return patterns_pb2.Priority(
        td_error=patterns_pb2.Priority.TDError(
            max_priority_weight=max_priority_weight, flat_source_index=index
        )
    )


def create_config(
    pattern: Pattern,
    table: str,
    conditions: Sequence[patterns_pb2.Condition] = (),
    priority: Optional[patterns_pb2.Priority] = None,
) -> Config:
    """A config inserting `pattern` into `table` whenever every condition holds (priority
    1.0 unless given)."""
    flat = _nest.flatten(pattern)
    for node in flat:
        if not isinstance(node, patterns_pb2.PatternNode):
            raise ValueError(f"Every leaf of the pattern must be a PatternNode, got {node!r}")
    structure = _nest.map_structure(lambda _: None, pattern)
    return Config(
        flat=flat,
        pattern_structure=_structure.encode(structure),
        table=table,
        priority=priority if priority is not None else constant_priority_fn(1.0),
        conditions=list(conditions),
    )


def unpack_pattern(config: Config) -> Pattern:
    """The pattern of a config, as the nest it was built from."""
    if not config.HasField("pattern_structure"):
        return list(config.flat)
    structure = _structure.decode(config.pattern_structure)
    return _nest.pack_sequence_as(structure, list(config.flat))


def _rows(node: patterns_pb2.PatternNode) -> Optional[int]:
    """Rows a node takes (None: a single squeezed step)."""
    if not node.HasField("start"):
        return None
    step = node.step if node.HasField("step") else 1
    stop = node.stop if node.HasField("stop") else 0
    return max(0, -(-(stop - node.start) // step))


def infer_signature(configs: Sequence[Config], step_spec: Any) -> Any:
    """The table signature (a nest of `tf.TensorSpec`) of the items `configs` make from steps
    of `step_spec` (a nest of `tf.TensorSpec` or arrays). ValueError when there are no
    configs, or they target different tables, or make items of different structures, dtypes
    or shapes; a leading dimension that varies between configs becomes `None`. Needs
    TensorFlow."""
    import tensorflow as tf

    if not configs:
        raise ValueError("At least one config must be provided.")
    if any(c.pattern_structure != configs[0].pattern_structure for c in configs):
        raise ValueError("All configs must have exactly the same pattern_structure.")
    tables = sorted({c.table for c in configs})
    if len(tables) > 1:
        raise ValueError(
            f"All configs must target the same table but provided configs included "
            f"{', '.join(tables)}."
        )
    flat_spec = _nest.flatten(step_spec)

    def spec_of(path: tuple, nodes: List[patterns_pb2.PatternNode]) -> Any:
        for node in nodes:
            if not 0 <= node.flat_source_index < len(flat_spec):
                raise ValueError(
                    f"The pattern at {path} references leaf {node.flat_source_index} but the "
                    f"step has {len(flat_spec)} leaves."
                )
        dtypes = [tf.dtypes.as_dtype(flat_spec[n.flat_source_index].dtype) for n in nodes]
        if any(d != dtypes[0] for d in dtypes):
            raise ValueError(
                f"Configs produce trajectories with multiple dtypes at {path}. Got {dtypes}."
            )
        shapes = []
        for node in nodes:
            row = list(tf.TensorShape(flat_spec[node.flat_source_index].shape))
            rows = _rows(node)
            shapes.append(tf.TensorShape(row if rows is None else [rows, *row]))
        if any(s.rank != shapes[0].rank for s in shapes) or (
            shapes[0].rank > 1 and any(s[1:] != shapes[0][1:] for s in shapes)
        ):
            raise ValueError(
                f"Configs produce trajectories with incompatible shapes at {path}. Got {shapes}."
            )
        if all(s == shapes[0] for s in shapes):
            shape = shapes[0]
        else:
            shape = tf.TensorShape([None, *shapes[0][1:]])
        return tf.TensorSpec(shape=shape, dtype=dtypes[0], name="/".join(str(p) for p in path))

    patterns = [unpack_pattern(c) for c in configs]
    paths = [path for path, _ in _nest.flatten_with_path(patterns[0])]
    flats = [_nest.flatten(p) for p in patterns]
    specs = [spec_of(path, [flat[i] for flat in flats]) for i, path in enumerate(paths)]
    return _nest.pack_sequence_as(patterns[0], specs)


class _ConditionBuilder:
    """A left-hand side waiting for its comparison (`%`, `==`, `!=`, `>`, `>=`, `<`, `<=`)."""

    def __init__(self, incomplete: patterns_pb2.Condition) -> None:
        self._incomplete = incomplete

    def __mod__(self, mod: int) -> _ConditionBuilder:
        condition = copy.deepcopy(self._incomplete)
        condition.mod_eq.mod = mod
        return _ConditionBuilder(condition)

    def __eq__(self, value: int) -> patterns_pb2.Condition:  # type: ignore[override]
        condition = copy.deepcopy(self._incomplete)
        if condition.mod_eq.mod:
            condition.mod_eq.eq = value
        else:
            condition.eq = value
        return condition

    def __ne__(self, value: int) -> patterns_pb2.Condition:  # type: ignore[override]
        condition = self == value
        condition.inverse = True
        return condition

    def __ge__(self, value: int) -> patterns_pb2.Condition:
        condition = copy.deepcopy(self._incomplete)
        condition.ge = value
        return condition

    def __gt__(self, value: int) -> patterns_pb2.Condition:
        return self >= value + 1

    def __lt__(self, value: int) -> patterns_pb2.Condition:
        condition = self >= value
        condition.inverse = True
        return condition

    def __le__(self, value: int) -> patterns_pb2.Condition:
        return self < value + 1

    __hash__ = None  # type: ignore[assignment]


class Condition:
    """The left-hand sides conditions are built from."""

    @staticmethod
    def step_index() -> _ConditionBuilder:
        """Index (from 0) of the newest step within the episode."""
        return _ConditionBuilder(patterns_pb2.Condition(step_index=True))

    @staticmethod
    def steps_since_applied() -> _ConditionBuilder:
        """Steps appended since the config last made an item."""
        return _ConditionBuilder(patterns_pb2.Condition(steps_since_applied=True))

    @staticmethod
    def is_end_episode() -> patterns_pb2.Condition:
        """True only while `end_episode` is called (the config then applies there)."""
        return patterns_pb2.Condition(is_end_episode=True, eq=1)

    @staticmethod
    def data(step_structure: Any) -> Any:
        """A nest like `step_structure` whose leaves compare the newest step's value of that
        leaf (a scalar integer or bool)."""
        count = len(_nest.flatten(step_structure))
        return _nest.pack_sequence_as(
            step_structure,
            [_ConditionBuilder(patterns_pb2.Condition(flat_source_index=i)) for i in range(count)],
        )
