"""TFClient: insert, sample and update_priorities from eager code, tf.function and TF1 sessions,
against a real server."""

from __future__ import annotations

import numpy as np
import pytest

import reverb

tf = pytest.importorskip("tensorflow")


@pytest.fixture
def server():
    tables = [
        reverb.Table.queue("q", 100),
        reverb.Table(
            "p",
            reverb.selectors.Prioritized(1.0),
            reverb.selectors.Fifo(),
            100,
            reverb.rate_limiters.MinSize(1),
        ),
    ]
    with reverb.Server(tables) as s:
        yield s


def _client(server: reverb.Server) -> reverb.TFClient:
    return reverb.TFClient(f"localhost:{server.port}")


def test_insert_then_sample_round_trip_in_tf_function(server) -> None:
    client = _client(server)

    @tf.function
    def insert(x: tf.Tensor, y: tf.Tensor) -> None:
        client.insert([x, y], tf.constant(["q", "p"]), tf.constant([1.0, 2.5], tf.float64))

    insert(tf.constant([1.0, 2.0], tf.float32), tf.constant(7, tf.int64))
    assert server.localhost_client().server_info(timeout=10)["q"].current_size == 1

    @tf.function
    def sample() -> reverb.ReplaySample:
        return client.sample("q", [tf.float32, tf.int64])

    s = sample()
    np.testing.assert_array_equal(s.data[0].numpy(), [1.0, 2.0])
    assert int(s.data[1]) == 7
    assert s.info.key.dtype == tf.uint64 and s.info.times_sampled.dtype == tf.int32
    s = client.sample("p", {"x": tf.float32, "y": tf.int64})  # eager, nested dtypes
    assert float(s.info.priority) == 2.5
    assert int(s.data["y"]) == 7


def test_sample_reads_items_written_by_the_python_client(server) -> None:
    server.localhost_client().insert([np.arange(3, dtype=np.int32)], {"q": 1.0})
    s = _client(server).sample("q", [tf.int32])
    np.testing.assert_array_equal(s.data[0].numpy(), [0, 1, 2])


def test_update_priorities(server) -> None:
    py = server.localhost_client()
    py.insert([np.float32(1)], {"p": 1.0})
    key = int(_client(server).sample("p", [tf.float32]).info.key)
    _client(server).update_priorities(
        "p", tf.constant([key, 12345], tf.uint64), tf.constant([4.0, 1.0], tf.float64)
    )  # unknown keys are ignored
    assert float(_client(server).sample("p", [tf.float32]).info.priority) == 4.0


def test_tf1_graph_mode(server) -> None:
    address = f"localhost:{server.port}"
    with tf.Graph().as_default():
        client = reverb.TFClient(address)
        value = tf.compat.v1.placeholder(tf.int32, [2])
        insert = client.insert([value], tf.constant(["q"]), tf.constant([1.0], tf.float64))
        sample = client.sample("q", [tf.int32])
        with tf.compat.v1.Session() as sess:
            sess.run(insert, {value: [3, 4]})
            got = sess.run(sample)
    np.testing.assert_array_equal(got.data[0], [3, 4])


def test_unknown_table_is_not_found(server) -> None:
    client = _client(server)
    with pytest.raises(tf.errors.NotFoundError, match="nope"):
        client.update_priorities(
            "nope", tf.constant([1], tf.uint64), tf.constant([1.0], tf.float64)
        )
    with pytest.raises(tf.errors.NotFoundError, match="nope"):
        client.sample("nope", [tf.float32])
    with pytest.raises(tf.errors.NotFoundError, match="nope"):
        client.insert([tf.constant(1.0)], tf.constant(["nope"]), tf.constant([1.0], tf.float64))
    # Nothing was stored by the failed insert, and the server still serves.
    assert server.localhost_client().server_info(timeout=10)["q"].current_size == 0


def test_dtype_mismatch_is_a_tf_error_naming_it(server) -> None:
    client = _client(server)
    client.insert([tf.constant([1.0, 2.0])], tf.constant(["q"]), tf.constant([1.0], tf.float64))
    # (The reference raises InvalidArgumentError eagerly; in a TF1 graph TensorFlow's own
    # output check turns its kernel's wrong output into InternalError. See the README.)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"(?s)\(int64, <unknown>\).*\(float, \[2\]\).*data\[0\]",
    ):
        client.sample("q", [tf.int64])


def test_sample_honours_rate_limiter_timeout(server) -> None:
    with pytest.raises(tf.errors.DeadlineExceededError):
        _client(server).sample("q", [tf.float32], rate_limiter_timeout_ms=50)


@pytest.mark.parametrize(
    "tables, priorities, message",
    [
        (tf.constant([1]), tf.constant([1.0], tf.float64), "tables must be a string"),
        (tf.constant("q"), tf.constant([1.0], tf.float64), "tables must be a string"),
        (tf.constant(["q"]), tf.constant([1.0], tf.float32), "priorities must be a float64"),
        (tf.constant(["q"]), tf.constant([1.0, 2.0], tf.float64), "same shape"),
    ],
)
def test_insert_argument_checks(server, tables, priorities, message) -> None:
    with pytest.raises(ValueError, match=message):
        _client(server).insert([tf.constant(1.0)], tables, priorities)


def test_update_priorities_shape_check(server) -> None:
    message = r"Tensors `keys` and `priorities` do not match in shape \(\[2\] vs. \[1\]\)"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _client(server).update_priorities(
            "p", tf.constant([1, 2], tf.uint64), tf.constant([1.0], tf.float64)
        )
    # In a graph the op is built, and fails when it runs (as the reference's).
    with tf.Graph().as_default():
        op = _client(server).update_priorities(
            "p", tf.constant([1, 2], tf.uint64), tf.constant([1.0], tf.float64)
        )
        with tf.compat.v1.Session() as session:
            with pytest.raises(tf.errors.InvalidArgumentError, match=message):
                session.run(op)


def test_dead_server_is_an_error_not_a_hang(monkeypatch) -> None:
    # Ops without a timeout wait for an unreachable server this long, then fail.
    monkeypatch.setenv("REVERB_CONNECT_WAIT_SECONDS", "1")
    with reverb.Server([reverb.Table.queue("q", 10)]) as s:
        client = reverb.TFClient(f"localhost:{s.port}")
    # TensorFlow reports UNAVAILABLE from a non-communication op as INTERNAL.
    errors = (tf.errors.UnavailableError, tf.errors.InternalError)
    with pytest.raises(errors, match=f"localhost:{s.port}"):
        client.insert([tf.constant(1.0)], tf.constant(["q"]), tf.constant([1.0], tf.float64))
    with pytest.raises(errors, match=f"localhost:{s.port}"):
        client.sample("q", [tf.float32])


def test_insert_times_out_when_the_table_is_full(server) -> None:
    # A queue of 100 blocks inserts once full: the insert op fails after its timeout.
    client = _client(server)
    for i in range(100):
        client.insert([tf.constant(i)], tf.constant(["q"]), tf.constant([1.0], tf.float64))
    with pytest.raises(tf.errors.DeadlineExceededError):
        client.insert(
            [tf.constant(0)], tf.constant(["q"]), tf.constant([1.0], tf.float64), timeout_ms=100
        )
    assert server.localhost_client().server_info(timeout=10)["q"].current_size == 100


def test_insert_is_checked_against_the_table_signature() -> None:
    # A leaf fits a spec of its shape, or of its shape after a leading step of 1.
    signature = {"a": tf.TensorSpec([2], tf.float32), "b": tf.TensorSpec([1], tf.int32)}
    tables = [reverb.Table.queue("sig", 100, signature=signature), reverb.Table.queue("q", 100)]
    with reverb.Server(tables) as s:
        client = reverb.TFClient(f"localhost:{s.port}")

        def insert(a, b, table="sig"):
            client.insert([a, b], tf.constant([table]), tf.constant([1.0], tf.float64))

        insert(tf.constant([1.0, 2.0]), tf.constant(3))
        insert(tf.constant([1.0, 2.0]), tf.constant([3]))
        bad = [
            (
                tf.constant([1.0, 2.0], tf.float64),
                tf.constant(3),
                "index 0, saw a tensor of "
                r"dtype double, shape \[2\], but expected tensor 'a' of dtype float",
            ),
            (tf.constant([1.0, 2.0, 3.0]), tf.constant(3), r"index 0.*shape \[3\]"),
            (tf.constant([1.0, 2.0]), tf.constant([3, 4]), r"index 1.*compatible with \[1\]"),
            (tf.constant([[1.0, 2.0]]), tf.constant(3), "index 0"),
        ]
        for a, b, leaf in bad:
            with pytest.raises(tf.errors.InvalidArgumentError, match=f"table 'sig'.*{leaf}"):
                insert(a, b)
        with pytest.raises(
            tf.errors.InvalidArgumentError, match="called with 1 tensors, but table requires 2"
        ):
            client.insert([tf.constant(1.0)], tf.constant(["sig"]), tf.constant([1.0], tf.float64))
        # Nothing of a refused insert is stored, in any of its tables.
        with pytest.raises(tf.errors.InvalidArgumentError):
            client.insert(
                [tf.constant([1.0]), tf.constant(3)],
                tf.constant(["q", "sig"]),
                tf.constant([1.0, 1.0], tf.float64),
            )
        info = reverb.Client(f"localhost:{s.port}").server_info(timeout=10)
        assert (info["sig"].current_size, info["q"].current_size) == (2, 0)
        # A table without a signature takes anything.
        insert(tf.constant([1.0]), tf.constant(3), table="q")
