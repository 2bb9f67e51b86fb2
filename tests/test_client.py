"""Client: insert/sample round trips, SampleInfo, mutate_priorities, reset, server_info, errors."""

from __future__ import annotations

import collections
import pickle
import threading
import time

import numpy as np
import pytest
from _metrics import waited, waiting
from _wait import wait_for

import reverb
from reverb import rate_limiters, reverb_types, selectors

# Every test runs twice: inserting into this process's server directly, and over gRPC.
pytestmark = pytest.mark.usefixtures("both_paths")

T = 10.0  # timeout of calls that should not block

DTYPES = [
    np.float16,
    np.float32,
    np.float64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.bool_,
    np.complex64,
    np.complex128,
]
SHAPES = [(), (5,), (2, 3, 4), (0,), (3, 0, 2)]


def _values(dtype, shape, seed=0):
    """Values exercising the whole range of `dtype` (extremes, NaN/inf, negative zero)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    if dtype.kind == "b":
        flat = rng.integers(0, 2, size).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
        flat[: min(size, 2)] = [info.min, info.max][: min(size, 2)]
    elif dtype.kind == "f":
        flat = (rng.standard_normal(size) * 1000).astype(dtype)
        special = np.array([np.nan, np.inf, -np.inf, -0.0], dtype=dtype)
        flat[: min(size, 4)] = special[: min(size, 4)]
    else:
        flat = (rng.standard_normal(size) + 1j * rng.standard_normal(size)).astype(dtype)
    return flat.reshape(shape)


def _assert_identical(got, expected):
    expected = np.asarray(expected)
    assert isinstance(got, np.ndarray)
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


# --- Round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_round_trip_preserves_values_dtype_and_shape(client, dtype, shape):
    value = _values(dtype, shape)
    client.insert(value, {"queue": 1.0}, timeout=T)
    (steps,) = list(client.sample("queue", 1, timeout=T))
    assert len(steps) == 1
    (leaf,) = steps[0].data
    _assert_identical(leaf, value)


def test_round_trip_of_many_leaves_of_mixed_dtypes(client):
    data = [_values(dtype, (3, 2), seed=i) for i, dtype in enumerate(DTYPES)]
    client.insert(data, {"queue": 1.0}, timeout=T)
    (steps,) = list(client.sample("queue", 1, timeout=T))
    assert len(steps[0].data) == len(data)
    for got, expected in zip(steps[0].data, data):
        _assert_identical(got, expected)


def test_round_trip_of_python_scalars_and_lists(client):
    # Python lists are nests (like tf.nest), so [1, 2] contributes two scalar leaves.
    client.insert([3, 2.5, True, [1, 2]], {"queue": 1.0}, timeout=T)
    (steps,) = list(client.sample("queue", 1, timeout=T))
    expected = [np.asarray(v) for v in (3, 2.5, True, 1, 2)]
    assert len(steps[0].data) == len(expected)
    for got, want in zip(steps[0].data, expected):
        _assert_identical(got, want)


def test_round_trip_of_non_contiguous_arrays(client):
    base = np.arange(60, dtype=np.int32).reshape(6, 10)
    data = [base[::2, 1::3], base.T, np.asfortranarray(base)]
    client.insert(data, {"queue": 1.0}, timeout=T)
    (steps,) = list(client.sample("queue", 1, timeout=T))
    assert len(steps[0].data) == len(data)
    for got, expected in zip(steps[0].data, data):
        _assert_identical(got, np.ascontiguousarray(expected))


def test_round_trip_of_large_arrays(client):
    big = np.random.default_rng(1).standard_normal(400_000)  # 3.2 MB, > one response
    for _ in range(3):
        client.insert(big, {"queue": 1.0}, timeout=T)
    samples = list(client.sample("queue", 3, emit_timesteps=False, timeout=T))
    assert len(samples) == 3
    for sample in samples:
        _assert_identical(sample.data[0], big[None])


def test_round_trip_of_big_endian_arrays(client):
    """Regression: non-native byte order used to be rejected as an unsupported dtype."""
    value = np.arange(6, dtype=">i4").reshape(2, 3)
    client.insert(value, {"queue": 1.0}, timeout=T)
    (steps,) = list(client.sample("queue", 1, timeout=T))
    (leaf,) = steps[0].data
    np.testing.assert_array_equal(leaf, value)
    assert leaf.dtype == np.int32


def test_nested_data_is_flattened_in_tf_nest_order(client):
    Point = collections.namedtuple("Point", ["y", "x"])
    data = {
        "zeta": np.int64(6),
        "alpha": (np.int8(1), [np.float32(2), np.float64(3)]),
        "mid": Point(y=np.int16(4), x=np.uint8(5)),
    }
    client.insert(data, {"queue": 1.0}, timeout=T)
    (steps,) = list(client.sample("queue", 1, timeout=T))
    leaves = steps[0].data
    assert isinstance(leaves, list)
    # Sorted dict keys (alpha, mid, zeta); sequences and namedtuples in their own order.
    assert [leaf.item() for leaf in leaves] == [1, 2.0, 3.0, 4, 5, 6]
    assert [leaf.dtype for leaf in leaves] == [
        np.int8,
        np.float32,
        np.float64,
        np.int16,
        np.uint8,
        np.int64,
    ]


def test_dict_insertion_order_does_not_matter(client):
    client.insert({"b": np.int32(2), "a": np.int32(1)}, {"queue": 1.0}, timeout=T)
    client.insert({"a": np.int32(1), "b": np.int32(2)}, {"queue": 1.0}, timeout=T)
    samples = list(client.sample("queue", 2, timeout=T))
    assert len(samples) == 2
    for steps in samples:
        assert [int(x) for x in steps[0].data] == [1, 2]


# --- emit_timesteps ------------------------------------------------------------------------------


def test_emit_timesteps_true_yields_one_step_lists(client):
    data = [np.arange(6, dtype=np.float32).reshape(2, 3), np.int64(7)]
    client.insert(data, {"uniform": 1.0}, timeout=T)
    samples = list(client.sample("uniform", 3, emit_timesteps=True, timeout=T))
    assert len(samples) == 3
    for sample in samples:
        assert isinstance(sample, list) and len(sample) == 1
        (step,) = sample
        assert isinstance(step, reverb.ReplaySample)
        assert isinstance(step.info, reverb.SampleInfo)
        _assert_identical(step.data[0], data[0])
        _assert_identical(step.data[1], np.asarray(data[1]))


def test_emit_timesteps_false_adds_a_leading_time_dim(client):
    data = [np.arange(6, dtype=np.float32).reshape(2, 3), np.int64(7)]
    client.insert(data, {"uniform": 1.0}, timeout=T)
    samples = list(client.sample("uniform", 2, emit_timesteps=False, timeout=T))
    assert len(samples) == 2
    for sample in samples:
        assert isinstance(sample, reverb.ReplaySample)
        _assert_identical(sample.data[0], data[0][None])
        _assert_identical(sample.data[1], np.asarray([7], dtype=np.int64))


def test_sample_yields_exactly_num_samples(client, insert):
    insert(client, "uniform", range(5))
    for n in (1, 2, 7, 300):
        assert len(list(client.sample("uniform", n, timeout=T))) == n


# --- SampleInfo ----------------------------------------------------------------------------------


def test_sample_info_fields_are_python_numbers_with_correct_values(client, insert):
    insert(client, "uniform", [10, 11, 12, 13], priorities=[2.5, 2.5, 2.5, 2.5])
    seen = {}
    for steps in client.sample("uniform", 200, timeout=T):
        info = steps[0].info
        assert type(info.key) is int
        assert type(info.probability) is float
        assert type(info.table_size) is int
        assert type(info.priority) is float
        assert type(info.times_sampled) is int
        assert info.probability == pytest.approx(0.25)
        assert info.table_size == 4
        assert info.priority == 2.5
        value = int(steps[0].data[0])
        # Each item keeps its key, and times_sampled counts up by one per sample.
        key, count = seen.get(value, (info.key, 0))
        assert info.key == key
        assert info.times_sampled == count + 1
        seen[value] = (key, count + 1)
    assert sum(count for _, count in seen.values()) == 200
    assert set(seen) == {10, 11, 12, 13}
    assert len({key for key, _ in seen.values()}) == 4


def test_sample_info_fields_from_prioritized_table(client, insert):
    insert(client, "prioritized", [0, 1], priorities=[1.0, 3.0])
    weights = {0: 1.0, 1: 3.0**0.8}
    total = sum(weights.values())
    samples = list(client.sample("prioritized", 50, timeout=T))
    assert len(samples) == 50
    for steps in samples:
        info = steps[0].info
        value = int(steps[0].data[0])
        assert info.priority == [1.0, 3.0][value]
        assert info.probability == pytest.approx(weights[value] / total, rel=1e-9)
        assert info.table_size == 2


# --- Several tables ------------------------------------------------------------------------------


def test_insert_into_several_tables_shares_one_step(client, tables):
    data = {"obs": np.arange(4, dtype=np.float32), "act": np.int32(3)}
    client.insert(data, {"uniform": 1.5, "queue": 2.0, "max_heap": 0.5}, timeout=T)
    for name, priority in [("uniform", 1.5), ("queue", 2.0), ("max_heap", 0.5)]:
        info = tables[name].info
        assert info.current_size == 1
        assert info.num_episodes == 1
        assert info.rate_limiter_info.insert_stats.completed == 1
        (steps,) = list(client.sample(name, 1, timeout=T))
        assert steps[0].info.priority == priority
        _assert_identical(steps[0].data[0], np.int32(3))
        _assert_identical(steps[0].data[1], data["obs"])
    for name in ("prioritized", "stack", "min_heap", "max_times_sampled"):
        assert tables[name].info.current_size == 0


def test_deleting_a_shared_step_from_one_table_keeps_it_in_the_other(client, tables):
    client.insert(np.arange(3), {"uniform": 1.0, "min_heap": 1.0}, timeout=T)
    (steps,) = list(client.sample("uniform", 1, timeout=T))
    client.mutate_priorities("uniform", deletes=[steps[0].info.key], timeout=T)
    assert tables["uniform"].info.current_size == 0
    assert tables["uniform"].info.num_deleted_episodes == 1
    info = tables["min_heap"].info
    assert (info.current_size, info.num_episodes, info.num_deleted_episodes) == (1, 1, 0)
    (steps,) = list(client.sample("min_heap", 1, timeout=T))
    _assert_identical(steps[0].data[0], np.arange(3))
    assert steps[0].info.times_sampled == 1  # counted per table


# --- mutate_priorities ---------------------------------------------------------------------------


def _keys_by_value(client, table, n):
    keys = {}
    for steps in client.sample(table, n, timeout=T):
        keys[int(steps[0].data[0])] = steps[0].info.key
    return keys


def test_mutate_priorities_updates(client, insert):
    insert(client, "max_heap", [0, 1, 2], priorities=[1.0, 2.0, 3.0])
    keys = {}
    for expected in (2, 1, 0):
        (steps,) = list(client.sample("max_heap", 1, timeout=T))
        assert int(steps[0].data[0]) == expected
        keys[expected] = steps[0].info.key
        client.mutate_priorities("max_heap", updates={keys[expected]: -10.0 - expected}, timeout=T)
    # Now 0 has the highest priority (-10), and the sample reports the updated priority.
    (steps,) = list(client.sample("max_heap", 1, timeout=T))
    assert (steps[0].info.key, steps[0].info.priority) == (keys[0], -10.0)
    client.mutate_priorities("max_heap", updates={keys[2]: 100.0}, timeout=T)
    (steps,) = list(client.sample("max_heap", 1, timeout=T))
    assert (int(steps[0].data[0]), steps[0].info.priority) == (2, 100.0)


def test_priority_whose_weight_overflows_is_refused_and_nothing_changes(make_server):
    table = reverb.Table(
        name="squared",
        sampler=selectors.Prioritized(2.0),
        remover=selectors.Fifo(),
        max_size=10,
        rate_limiter=rate_limiters.MinSize(1),
    )
    server = make_server([table])
    client = reverb.Client(f"localhost:{server.port}")
    client.insert(np.int8(1), {"squared": 1e100}, timeout=T)
    with pytest.raises(ValueError, match="Priority 1e\\+?200 .*'squared'.*priority_exponent"):
        client.insert(np.int8(2), {"squared": 1e200}, timeout=T)
    (steps,) = list(client.sample("squared", 1, timeout=T))
    key = steps[0].info.key
    with pytest.raises(ValueError, match="priority_exponent"):
        client.mutate_priorities("squared", updates={key: 1e300}, timeout=T)
    (steps,) = list(client.sample("squared", 1, timeout=T))
    assert (steps[0].info.key, steps[0].info.priority) == (key, 1e100)
    assert steps[0].info.probability == 1.0
    assert table.info.current_size == 1


def test_mutate_priorities_changes_prioritized_probabilities(client, insert, tables):
    insert(client, "prioritized", [0, 1], priorities=[1.0, 1.0])
    keys = {}
    while len(keys) < 2:
        keys.update(_keys_by_value(client, "prioritized", 10))
    client.mutate_priorities("prioritized", updates={keys[0]: 0.0}, timeout=T)
    samples = list(client.sample("prioritized", 50, timeout=T))
    assert len(samples) == 50
    for steps in samples:
        assert int(steps[0].data[0]) == 1
        assert steps[0].info.probability == pytest.approx(1.0)
    assert tables["prioritized"].info.current_size == 2


def test_mutate_priorities_deletes_and_ignores_unknown_keys(client, insert, tables):
    insert(client, "queue", [0, 1, 2])
    # The queue deletes what it samples, so learn the keys from a uniform table instead.
    insert(client, "uniform", [0, 1, 2])
    keys = {}
    while len(keys) < 3:
        keys.update(_keys_by_value(client, "uniform", 20))
    unknown = max(keys.values()) ^ 0x5555
    client.mutate_priorities("uniform", deletes=[keys[1], unknown], timeout=T)
    info = tables["uniform"].info
    assert info.current_size == 2
    assert info.num_deleted_episodes == 1
    assert {int(s[0].data[0]) for s in client.sample("uniform", 60, timeout=T)} == {0, 2}
    # Unknown keys in updates and deletes are ignored, without error.
    client.mutate_priorities("uniform", updates={unknown: 5.0}, deletes=[keys[1]], timeout=T)
    assert tables["uniform"].info.current_size == 2
    # Other tables are untouched.
    assert tables["queue"].info.current_size == 3


def test_mutate_priorities_deletes_before_updating(client, insert, tables):
    insert(client, "min_heap", [0, 1], priorities=[1.0, 2.0])
    (steps,) = list(client.sample("min_heap", 1, timeout=T))
    key = steps[0].info.key
    client.mutate_priorities("min_heap", updates={key: 0.5}, deletes=[key], timeout=T)
    assert tables["min_heap"].info.current_size == 1
    (steps,) = list(client.sample("min_heap", 1, timeout=T))
    assert int(steps[0].data[0]) == 1


def test_mutate_priorities_with_nothing_is_a_no_op(client, insert, tables):
    insert(client, "uniform", [1])
    client.mutate_priorities("uniform", timeout=T)
    client.mutate_priorities("uniform", updates={}, deletes=[], timeout=T)
    assert tables["uniform"].info.current_size == 1


def test_invalid_priority_for_prioritized_table_changes_nothing(client, insert, tables):
    with pytest.raises(ValueError, match="[Pp]riority"):
        client.insert(np.int64(1), {"prioritized": -1.0}, timeout=T)
    assert tables["prioritized"].info.current_size == 0
    insert(client, "prioritized", [5], priorities=[2.0])
    (steps,) = list(client.sample("prioritized", 1, timeout=T))
    with pytest.raises(ValueError, match="[Pp]riority"):
        client.mutate_priorities("prioritized", updates={steps[0].info.key: -3.0}, timeout=T)
    (steps,) = list(client.sample("prioritized", 1, timeout=T))
    assert steps[0].info.priority == 2.0


# --- reset ---------------------------------------------------------------------------------------


def test_reset_empties_table_and_zeroes_counters(client, insert, tables):
    insert(client, "uniform", range(5))
    list(client.sample("uniform", 10, timeout=T))
    keys = _keys_by_value(client, "uniform", 30)
    client.mutate_priorities("uniform", deletes=list(keys.values())[:1], timeout=T)
    before = tables["uniform"].info
    assert before.num_unique_samples > 0 and before.num_deleted_episodes == 1
    insert(client, "queue", [1])

    client.reset("uniform", timeout=T)
    info = tables["uniform"].info
    assert info.current_size == 0
    assert info.num_episodes == 0
    assert info.num_deleted_episodes == 0
    assert info.num_unique_samples == 0
    assert info.rate_limiter_info.insert_stats.completed == 0
    assert info.rate_limiter_info.sample_stats.completed == 0
    assert not tables["uniform"].can_sample(1)
    assert tables["queue"].info.current_size == 1  # other tables untouched

    insert(client, "uniform", [42])
    (steps,) = list(client.sample("uniform", 1, timeout=T))
    assert int(steps[0].data[0]) == 42
    assert steps[0].info.table_size == 1


def test_reset_unblocks_an_insert_into_a_full_queue(make_server):
    table = reverb.Table.queue("q", 2)
    server = make_server([table], metrics_port=0)
    client = server.localhost_client()
    for i in range(2):
        client.insert(np.int64(i), {"q": 1.0}, timeout=T)
    errors = []

    def blocked_insert():
        try:
            client.insert(np.int64(2), {"q": 1.0}, timeout=T)
        except Exception as e:  # recorded and asserted below
            errors.append(e)

    thread = threading.Thread(target=blocked_insert)
    thread.start()
    wait_for(lambda: waiting(server.metrics_port, "q", "insert") == 1, T, "the insert to block")
    assert thread.is_alive()
    client.reset("q", timeout=T)
    thread.join(timeout=T)
    assert not thread.is_alive() and not errors
    assert table.info.current_size == 1
    (steps,) = list(client.sample("q", 1, timeout=T))
    assert int(steps[0].data[0]) == 2


# --- server_info ---------------------------------------------------------------------------------


def test_server_info_returns_table_infos_by_name(client, insert):
    insert(client, "stack", [1, 2])
    infos = client.server_info()
    assert isinstance(infos, dict)
    assert set(infos) == {
        "uniform",
        "prioritized",
        "queue",
        "stack",
        "min_heap",
        "max_heap",
        "max_times_sampled",
    }
    for name, info in infos.items():
        assert isinstance(info, reverb_types.TableInfo)
        assert info.name == name
    assert infos["stack"].current_size == 2
    assert infos["stack"].max_size == 10
    assert infos["max_times_sampled"].max_times_sampled == 2
    assert infos["prioritized"].sampler_options.prioritized.priority_exponent == pytest.approx(0.8)
    assert client.server_info(timeout=5)["stack"].current_size == 2
    assert client.server_info(timeout=0)["stack"].current_size == 2


# --- Errors --------------------------------------------------------------------------------------

EXISTING = ["max_heap", "max_times_sampled", "min_heap", "prioritized", "queue", "stack", "uniform"]


def _unknown_table_calls(client):
    return {
        "sample": lambda: list(client.sample("nope", 1, timeout=T)),
        "insert": lambda: client.insert(np.int8(1), {"nope": 1.0}, timeout=T),
        "mutate_priorities": lambda: client.mutate_priorities("nope", {1: 1.0}, timeout=T),
        "reset": lambda: client.reset("nope", timeout=T),
    }


@pytest.mark.parametrize("call", ["sample", "insert", "mutate_priorities", "reset"])
def test_unknown_table_error_names_table_and_lists_existing(client, call):
    with pytest.raises(Exception) as excinfo:
        _unknown_table_calls(client)[call]()
    message = str(excinfo.value)
    assert "nope" in message
    for name in EXISTING:
        assert name in message
    # As the reference: inserts check the table name first (ValueError); the other calls get
    # the server's NOT_FOUND.
    expected = ValueError if call == "insert" else reverb.errors.NotFoundError
    assert type(excinfo.value) is expected, repr(excinfo.value)


@pytest.mark.parametrize("call", ["sample", "mutate_priorities", "reset"])
def test_unknown_table_error_is_a_runtime_error_like_the_reference(client, call):
    with pytest.raises(RuntimeError, match="nope"):
        _unknown_table_calls(client)[call]()


def test_insert_into_unknown_table_raises_value_error_like_the_reference(client):
    """Regression: this used to raise NotFoundError (a RuntimeError), not ValueError."""
    with pytest.raises(ValueError, match="nope"):
        client.insert(np.int8(1), {"nope": 1.0}, timeout=T)


def test_insert_with_one_unknown_table_stores_nothing(client, tables):
    """Regression: the item used to be stored in 'uniform' before the call failed."""
    with pytest.raises(Exception, match="nope"):
        client.insert(np.int8(1), {"uniform": 1.0, "nope": 1.0}, timeout=T)
    assert tables["uniform"].info.current_size == 0


def test_insert_with_unknown_table_first_stores_nothing(client, tables):
    with pytest.raises(Exception, match="nope"):
        client.insert(np.int8(1), {"nope": 1.0, "uniform": 1.0}, timeout=T)
    assert tables["uniform"].info.current_size == 0
    assert tables["uniform"].info.rate_limiter_info.insert_stats.completed == 0


def test_failed_insert_loses_nothing_already_stored(client, insert, tables, sample_values):
    insert(client, "queue", [0, 1, 2])
    with pytest.raises(Exception, match="nope"):
        client.insert(np.int64(3), {"nope": 1.0}, timeout=T)
    with pytest.raises(ValueError):
        client.insert(np.array([object()]), {"queue": 1.0}, timeout=T)
    assert tables["queue"].info.current_size == 3
    assert sample_values(client, "queue", 3) == [0, 1, 2]


def test_empty_priorities_is_a_value_error(client, tables):
    with pytest.raises(ValueError, match="priorities"):
        client.insert(np.int8(1), {}, timeout=T)
    assert tables["uniform"].info.current_size == 0


@pytest.mark.parametrize("num_samples", [0, -1])
def test_num_samples_below_one_is_a_value_error(client, insert, num_samples):
    insert(client, "uniform", [1])
    with pytest.raises(ValueError, match="num_samples"):
        list(client.sample("uniform", num_samples, timeout=T))


@pytest.mark.parametrize("num_samples", [2.5, "2", True])
def test_num_samples_not_an_integer_is_a_type_error_before_any_sample(client, insert, num_samples):
    insert(client, "uniform", [1, 2, 3])
    samples = client.sample("uniform", num_samples, timeout=T)
    with pytest.raises(TypeError, match="num_samples must be an integer"):
        next(samples)


def test_nan_priority_on_a_uniform_table_says_what_is_wrong(client, tables):
    with pytest.raises(ValueError, match="Priority NaN .*'uniform': a priority must be a number"):
        client.insert(np.int8(1), {"uniform": float("nan")}, timeout=T)
    assert tables["uniform"].info.current_size == 0


@pytest.mark.parametrize(
    "data",
    [
        np.array([object(), 1], dtype=object),
        {"ok": np.int8(1), "bad": np.array([b"a", 2], dtype=object)},
        np.array([1 + 2j], dtype=np.clongdouble),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
    ],
    ids=["object-array", "nested-object", "clongdouble", "datetime"],
)
def test_unsupported_dtype_is_a_value_error(client, tables, data):
    """Strings are supported (tests/test_strings.py); other objects and dtypes are not."""
    with pytest.raises(ValueError):
        client.insert(data, {"uniform": 1.0}, timeout=T)
    assert tables["uniform"].info.current_size == 0


def test_empty_data_is_a_value_error(client):
    for data in ([], {}, ()):
        with pytest.raises(ValueError):
            client.insert(data, {"uniform": 1.0}, timeout=T)


def test_client_requires_an_address():
    with pytest.raises(ValueError):
        reverb.Client("")


# --- Pickling ------------------------------------------------------------------------------------


def test_client_pickle_round_trip(client, server):
    clone = pickle.loads(pickle.dumps(client))
    assert isinstance(clone, reverb.Client)
    assert clone is not client
    assert clone.server_address == client.server_address == f"localhost:{server.port}"
    clone.insert(np.int64(9), {"queue": 1.0}, timeout=T)
    (steps,) = list(client.sample("queue", 1, timeout=T))
    assert int(steps[0].data[0]) == 9
    assert set(clone.server_info(timeout=5)) == set(EXISTING)


# --- Timeouts and resilience ---------------------------------------------------------------------


def test_sample_from_blocked_table_times_out_quickly(client):
    start = time.monotonic()
    with pytest.raises(reverb.errors.DeadlineExceededError):
        list(client.sample("uniform", 1, timeout=0.3))
    elapsed = time.monotonic() - start
    assert 0.25 <= elapsed < 2.0
    assert issubclass(reverb.errors.DeadlineExceededError, reverb.errors.ReverbError)
    assert reverb.DeadlineExceededError is reverb.errors.DeadlineExceededError


def test_insert_into_full_queue_times_out_and_is_not_stored(make_server, sample_values):
    table = reverb.Table.queue("q", 2)
    server = make_server([table], metrics_port=0)
    client = server.localhost_client()
    for i in range(2):
        client.insert(np.int64(i), {"q": 1.0}, timeout=T)
    start = time.monotonic()
    with pytest.raises(reverb.errors.DeadlineExceededError):
        client.insert(np.int64(99), {"q": 1.0}, timeout=0.3)
    assert time.monotonic() - start < 2.0
    # Freeing space later must not let the abandoned insert through. (Over gRPC the
    # cancellation travels as a stream reset: wait until it reached the server, whose wait
    # for the insert has ended.)
    port = server.metrics_port
    wait_for(
        lambda: waiting(port, "q", "insert") == 0 and waited(port, "q", "insert") > 0,
        T,
        "the server to drop the abandoned insert",
    )
    assert sample_values(client, "q", 1) == [0]
    time.sleep(0.2)  # a time: the abandoned insert must NOT arrive within it
    assert table.info.current_size == 1
    assert table.info.rate_limiter_info.insert_stats.completed == 2
    assert sample_values(client, "q", 1) == [1]


def test_server_keeps_serving_after_a_client_error(server, client, insert, sample_values):
    other = server.localhost_client()
    with pytest.raises(reverb.errors.ReverbError):
        list(client.sample("nope", 1, timeout=T))
    with pytest.raises(reverb.errors.DeadlineExceededError):
        list(client.sample("queue", 1, timeout=0.2))
    with pytest.raises(ValueError):
        client.insert(np.array([object()]), {"queue": 1.0}, timeout=T)
    insert(other, "queue", [1, 2])
    insert(client, "queue", [3])
    assert sample_values(other, "queue", 2) == [1, 2]
    assert sample_values(client, "queue", 1) == [3]


def test_custom_rate_limited_table_blocks_sampling(make_server):
    table = reverb.Table("t", selectors.Uniform(), selectors.Fifo(), 10, rate_limiters.MinSize(3))
    client = make_server([table]).localhost_client()
    for i in range(2):
        client.insert(np.int8(i), {"t": 1.0}, timeout=T)
    with pytest.raises(reverb.errors.DeadlineExceededError):
        list(client.sample("t", 1, timeout=0.2))
    client.insert(np.int8(2), {"t": 1.0}, timeout=T)
    assert len(list(client.sample("t", 5, timeout=T))) == 5


def test_insert_refuses_data_that_disagrees_with_the_signature(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    signature = {"obs": tf.TensorSpec([2], tf.float32), "t": tf.TensorSpec([None], tf.int64)}
    server = make_server(
        [reverb.Table.queue("t", 10, signature=signature), reverb.Table.queue("free", 10)]
    )
    client = server.localhost_client()
    good = {"obs": np.zeros(2, np.float32), "t": np.int64(3)}  # t: one step of a [None] spec
    client.insert(good, {"t": 1.0, "free": 1.0}, timeout=10)
    bad = [
        (
            {"obs": np.zeros(3, np.float32), "t": np.int64(3)},
            r"index 0, saw a tensor of dtype float, shape \[3\], but expected tensor 'obs' of "
            r"dtype float and shape compatible with \[2\]\.",
        ),
        ({"obs": np.zeros(2, np.float64), "t": np.int64(3)}, "dtype double"),
        ({"obs": np.zeros(2, np.float32)}, "called with 1 tensors, but table requires 2 tensors"),
    ]
    for data, message in bad:
        with pytest.raises(ValueError, match="CreateItem in table 't' because.*" + message):
            # A bad table refuses the whole insert: nothing lands in "free" either.
            client.insert(data, {"free": 1.0, "t": 1.0}, timeout=10)
    infos = client.server_info(timeout=10)
    assert infos["t"].current_size == 1 and infos["free"].current_size == 1
