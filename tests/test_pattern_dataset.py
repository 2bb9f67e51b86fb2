"""`PatternDataset` and `pattern_dataset_with_info`: configs applied to a `tf.data` stream of
steps, with and without episode boundaries, in eager mode, in a `tf.function` and in a TF1
graph; bad input."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from _pattern_scenarios import SCENARIOS, R, run, steps  # noqa: E402

import reverb  # noqa: E402
from reverb import structured_writer as sw  # noqa: E402

C = sw.Condition
SPEC_V = {"a": None, "free": None, "v": None}

# What each scenario must give, worked out by hand from the semantics (and what dm-reverb
# 0.14 gives: tests/test_interop.py). Steps: a = i, b = [i, -i]; data is flattened.
EXPECTED = {
    # Episodes 0-3, 4-7, 8-10: a[-3:] needs three steps of the episode.
    "slices_respecting_episodes": [
        [[0, 1, 2], [2.0, -2.0]],
        [[1, 2, 3], [3.0, -3.0]],
        [[4, 5, 6], [6.0, -6.0]],
        [[5, 6, 7], [7.0, -7.0]],
        [[8, 9, 10], [10.0, -10.0]],
    ],
    "slices_across_episodes": [[[i - 2, i - 1, i], [float(i), -float(i)]] for i in range(2, 11)],
    # Transitions (next, observation, rewards): 3-step ones while the episode runs, then the
    # 1- and 2-step ones at its end (configs in order).
    "n_step_transitions": [
        [3, 0, [[0.0, -0.0], [1.0, -1.0], [2.0, -2.0]]],
        [4, 1, [[1.0, -1.0], [2.0, -2.0], [3.0, -3.0]]],
        [5, 2, [[2.0, -2.0], [3.0, -3.0], [4.0, -4.0]]],
        [5, 4, [[4.0, -4.0]]],
        [5, 3, [[3.0, -3.0], [4.0, -4.0]]],
        [9, 6, [[6.0, -6.0], [7.0, -7.0], [8.0, -8.0]]],
        [10, 7, [[7.0, -7.0], [8.0, -8.0], [9.0, -9.0]]],
        [11, 8, [[8.0, -8.0], [9.0, -9.0], [10.0, -10.0]]],
        [11, 10, [[10.0, -10.0]]],
        [11, 9, [[9.0, -9.0], [10.0, -10.0]]],
    ],
    "conditions": [0, 0, 2, 2, 2, 3, 3, 4, 5, 5, 5, 6, 6, 7, 8, 8, 9, 9, 9, 10, 11, 11],
    # The second config also needs six steps held: the reference makes every config require
    # the longest history of the configs before it.
    "strided_and_end_of_episode": [
        [0, 2, 4],
        [1, 3],
        [1, 3, 5],
        [5, 6],
        [7, 9, 11],
        [8, 10],
        [8, 10, 12],
        [12, 13],
        [14, 16, 18],
        [15, 17],
    ],
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenarios_give_exactly_the_expected_trajectories(name) -> None:
    assert run(*SCENARIOS[name]) == EXPECTED[name]


def _transitions() -> list:
    configs, _, _, _ = SCENARIOS["n_step_transitions"]
    return configs


def _is_end(step) -> tf.Tensor:
    return tf.equal(step["a"] % 6, 5)


def test_element_spec_is_the_inferred_signature_and_configs_are_not_changed() -> None:
    configs = _transitions()
    before = [c.SerializeToString() for c in configs]
    dataset = reverb.PatternDataset(steps(14), configs, True, _is_end)
    assert tf.nest.map_structure(lambda s: (s.shape, s.dtype), dataset.element_spec) == {
        "n": (tf.TensorShape([]), tf.int32),
        "o": (tf.TensorShape([]), tf.int32),
        "r": (tf.TensorShape([None, 2]), tf.float32),
    }
    assert [c.SerializeToString() for c in configs] == before
    assert isinstance(dataset, tf.data.Dataset)
    assert reverb.pattern_dataset.PatternDataset is reverb.PatternDataset


def test_runs_in_a_tf_function_and_batches() -> None:
    dataset = reverb.PatternDataset(steps(14), _transitions(), True, _is_end)

    @tf.function
    def total() -> tf.Tensor:
        return dataset.reduce(tf.constant(0), lambda acc, x: acc + x["n"])

    assert int(total()) == sum(t[0] for t in EXPECTED["n_step_transitions"])
    first = next(iter(dataset.filter(lambda x: tf.shape(x["r"])[0] == 3).batch(2)))
    assert first["o"].numpy().tolist() == [0, 1]


def test_runs_in_a_tf1_graph() -> None:
    with tf.Graph().as_default():
        dataset = reverb.PatternDataset(steps(14), _transitions(), True, _is_end)
        next_element = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        with tf.compat.v1.Session() as session:
            got = [session.run(next_element)["o"] for _ in range(3)]
    assert [int(x) for x in got] == [0, 1, 2]


def test_pattern_dataset_with_info_adds_zero_infos() -> None:
    dataset = reverb.pattern_dataset.pattern_dataset_with_info(
        steps(14), _transitions(), True, _is_end
    )
    sample = next(iter(dataset))
    assert isinstance(sample, reverb.ReplaySample)
    assert int(sample.info.key) == 0 and float(sample.info.probability) == 0.0
    assert int(sample.data["o"]) == 0


def test_is_end_of_episode_may_use_python_control_flow() -> None:
    """Autograph converts the user's `is_end_of_episode` (with a Python `if` on a tensor), as
    it does under the reference; our own dataset code is kept out of autograph, not this."""

    def is_end(step):
        if step["a"] % 6 == 5:
            return True
        return False

    tf.autograph.set_verbosity(0)
    with_if = reverb.PatternDataset(steps(14), _transitions(), True, is_end)
    plain = reverb.PatternDataset(steps(14), _transitions(), True, _is_end)
    assert [x["o"].numpy().tolist() for x in with_if] == [x["o"].numpy().tolist() for x in plain]


def test_is_end_of_episode_must_return_a_bool_scalar() -> None:
    config = sw.create_config(R["a"][-1], "t")
    with pytest.raises(ValueError, match="Invalid `is_end_of_episode`.*must return `bool`"):
        reverb.PatternDataset(steps(4), [config], True, lambda step: step["a"])


def test_bad_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="At least one config"):
        reverb.PatternDataset(steps(4), [], True, _is_end)
    other = sw.create_config({"x": R["a"][-1]}, "t")
    with pytest.raises(ValueError, match="same pattern_structure"):
        reverb.PatternDataset(steps(4), [sw.create_config(R["a"][-1], "t"), other], True, _is_end)
    node = sw.patterns_pb2.PatternNode(flat_source_index=7, stop=-1)
    with pytest.raises(ValueError, match="leaf 7"):
        reverb.PatternDataset(steps(4), [sw.create_config(node, "t")], True, _is_end)


def test_tuple_steps_and_tuple_patterns() -> None:
    """Tuple elements are unpacked for `is_end_of_episode` (as tf.data calls a map function),
    and a tuple pattern makes tuple elements."""
    ds = tf.data.Dataset.range(6).map(lambda i: (tf.cast(i, tf.int32), tf.equal(i % 3, 2)))
    spec_ref = sw.create_reference_step((None, None))
    config = sw.create_config((spec_ref[0][-1], spec_ref[0][-2:]), "t")
    dataset = reverb.PatternDataset(ds, [config], True, lambda i, done: done)
    got = [(int(a), b.numpy().tolist()) for a, b in dataset]
    assert got == [(1, [0, 1]), (2, [1, 2]), (4, [3, 4]), (5, [4, 5])]
    with_info = reverb.pattern_dataset.pattern_dataset_with_info(ds, [config], True, lambda i, d: d)
    assert next(iter(with_info)).data[1].numpy().tolist() == [0, 1]


def test_unused_leaves_may_have_any_shape_and_bool_vectors_never_hold() -> None:
    def step(i):
        return {
            "a": tf.cast(i, tf.int32),
            "free": tf.zeros([i % 2 + 1]),
            "v": tf.ones([1], tf.bool),
        }

    ds = tf.data.Dataset.range(4).map(step)
    ds = ds.map(lambda s: {**s, "free": tf.ensure_shape(s["free"], [None])})
    configs = [sw.create_config(R["a"][-1], "t", [C.data(SPEC_V)["v"] == 1])]
    dataset = reverb.PatternDataset(ds, configs, True, lambda s: tf.constant(False))
    assert [int(x) for x in dataset] == [0, 1, 2, 3]  # bool[1] is compared like a scalar


def test_an_endless_input_makes_an_endless_dataset() -> None:
    dataset = reverb.PatternDataset(steps(3).repeat(), _transitions(), True, _is_end)
    assert int(dataset.cardinality()) == tf.data.INFINITE_CARDINALITY
    assert len(list(dataset.take(4))) == 4


def _ragged_steps(lengths: list) -> tf.data.Dataset:
    """Step i: `x` = [i] * lengths[i] (shape [None]), `a` = i, `last` on the given steps."""

    def gen():
        for i, n in enumerate(lengths):
            yield {"x": [i] * n, "a": i}

    spec = {"x": tf.TensorSpec([None], tf.int32), "a": tf.TensorSpec([], tf.int32)}
    return tf.data.Dataset.from_generator(gen, output_signature=spec)


def test_leaves_with_undefined_dims_may_change_shape_between_episodes() -> None:
    # Episodes of 3 steps; each episode's rows have one length, the next another.
    lengths = [1, 1, 1, 3, 3, 3, 2, 2, 2]
    ds = _ragged_steps(lengths)
    spec = {"x": None, "a": None}
    configs = [sw.create_config(sw.pattern_from_transform(spec, lambda s: s["x"][-2:]), "t")]
    dataset = reverb.PatternDataset(ds, configs, True, lambda s: s["a"] % 3 == 2)
    assert dataset.element_spec.shape.as_list() == [2, None]
    got = [x.numpy().tolist() for x in dataset]
    assert got == [
        [[0], [1]],
        [[1], [2]],
        [[3, 3, 3], [4, 4, 4]],
        [[4, 4, 4], [5, 5, 5]],
        [[6, 6], [7, 7]],
        [[7, 7], [8, 8]],
    ]
    # A single step of such a leaf, with the scalar beside it.
    last = sw.pattern_from_transform(spec, lambda s: (s["x"][-1], s["a"][-1]))
    dataset = reverb.PatternDataset(ds, [sw.create_config(last, "t")], False, lambda s: False)
    assert [(x.numpy().tolist(), int(a)) for x, a in dataset] == [
        ([i] * n, i) for i, n in enumerate(lengths)
    ]


def test_a_trajectory_across_rows_of_two_shapes_is_an_error() -> None:
    spec = {"x": None, "a": None}
    configs = [sw.create_config(sw.pattern_from_transform(spec, lambda s: s["x"][-2:]), "t")]
    # Without episode boundaries the second trajectory would stack [0] and [1, 1].
    dataset = reverb.PatternDataset(_ragged_steps([1, 2, 2]), configs, False, lambda s: False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="different shapes"):
        list(dataset)


def test_data_conditions_on_leaves_of_undefined_shape_hold_for_one_element_rows() -> None:
    # `x` has shape [None]; rows of one element are compared, others never hold.
    def gen():
        for i, row in enumerate([[1], [0], [1, 1], [1], []]):
            yield {"x": row, "a": i}

    spec = {"x": tf.TensorSpec([None], tf.int32), "a": tf.TensorSpec([], tf.int32)}
    ds = tf.data.Dataset.from_generator(gen, output_signature=spec)
    steps = {"x": None, "a": None}
    pattern = sw.pattern_from_transform(steps, lambda s: s["a"][-1])
    for condition, expected in (
        (C.data(steps)["x"] == 1, [0, 3]),
        (C.data(steps)["x"] != 1, [1]),
    ):
        configs = [sw.create_config(pattern, "t", [condition])]
        dataset = reverb.PatternDataset(ds, configs, False, lambda s: False)
        assert [int(a) for a in dataset] == expected


def test_iterators_can_be_checkpointed_and_restored(tmp_path) -> None:
    """The per-step kernel is a pure function of its inputs, so tf.data can save an
    iterator's position (its scan state included) and restore it."""
    configs = [sw.create_config(R["a"][-3:], "t")]
    dataset = reverb.PatternDataset(steps(10), configs, True, _is_end)
    iterator = iter(dataset)
    assert next(iterator).numpy().tolist() == [0, 1, 2]
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(str(tmp_path / "it"))
    rest = [x.numpy().tolist() for x in iterator]
    assert rest == [[1, 2, 3], [2, 3, 4], [3, 4, 5], [6, 7, 8], [7, 8, 9]]
    checkpoint.restore(path)
    assert [x.numpy().tolist() for x in iterator] == rest
