"""TrajectoryDataset and TimestepDataset against real servers: eager, tf.function, TF1 graph
mode, tf.distribute; clean ends; several iterators; bad specs; dead servers.

Also run under TensorFlow 2.15 by tests/test_tf_kernels.py (in the reference's virtualenv)."""

from __future__ import annotations

import contextlib
import gc
import threading
import time

import numpy as np
import pytest
from _metrics import waiting
from _wait import wait_for

import reverb

tf = pytest.importorskip("tensorflow")

SPEC = {"obs": tf.TensorSpec([2, 3], tf.float32), "action": tf.TensorSpec([], tf.int32)}


def _queue(name: str = "q", size: int = 1000, signature: object = None) -> reverb.Table:
    return reverb.Table.queue(name, size, signature=signature)


def _uniform(name: str = "u", signature: object = None) -> reverb.Table:
    return reverb.Table(
        name,
        reverb.selectors.Uniform(),
        reverb.selectors.Fifo(),
        1000,
        reverb.rate_limiters.MinSize(1),
        signature=signature,
    )


def _write(client: reverb.Client, table: str, steps: int) -> None:
    """Items of 2 steps: obs[t] = [t, t, t] (float32[2,3]), action = t (the last step)."""
    with client.trajectory_writer(2) as w:
        for t in range(steps):
            w.append({"obs": np.full([3], t, np.float32), "action": np.int32(t)})
            if t >= 1:
                w.create_item(
                    table, 1.0, {"obs": w.history["obs"][-2:], "action": w.history["action"][-1]}
                )
        w.flush(timeout_ms=10_000)


def _dataset(address: str, table: str = "q", **kwargs) -> reverb.TrajectoryDataset:
    args = dict(
        dtypes={"obs": tf.float32, "action": tf.int32},
        shapes={"obs": [2, 3], "action": []},
        max_in_flight_samples_per_worker=4,
        rate_limiter_timeout_ms=300,
    )
    args.update(kwargs)
    return reverb.TrajectoryDataset(address, table, **args)


# Every test runs twice: through this process's server directly, and over gRPC.
pytestmark = pytest.mark.usefixtures("both_paths")


@pytest.fixture
def server():
    tables = [_queue(), _uniform(), _queue("sig", signature=SPEC)]
    with reverb.Server(tables, metrics_port=0) as s:
        yield s


def _address(server: reverb.Server) -> str:
    return f"localhost:{server.port}"


def test_items_arrive_in_order_with_info_and_end_cleanly_on_rate_limiter_timeout(server) -> None:
    client = server.localhost_client()
    _write(client, "q", 11)
    ds = _dataset(_address(server))
    assert ds.element_spec.data["obs"] == tf.TensorSpec([2, 3], tf.float32)
    assert ds.element_spec.info.key == tf.TensorSpec([], tf.uint64)
    samples = list(ds)  # ends when the empty queue blocks for 300 ms: no error
    assert [int(s.data["action"]) for s in samples] == list(range(1, 11))
    for s in samples:
        a = int(s.data["action"])
        np.testing.assert_array_equal(s.data["obs"].numpy(), [[a - 1] * 3, [a] * 3])
        assert s.info.probability.dtype == tf.float64
        assert s.info.table_size.dtype == tf.int64
        assert int(s.info.times_sampled) == 1
        assert float(s.info.priority) == 1.0
    assert len({int(s.info.key) for s in samples}) == 10


def test_batch_and_prefetch(server) -> None:
    _write(server.localhost_client(), "q", 9)
    ds = _dataset(_address(server)).batch(3).prefetch(2)
    batches = list(ds)
    assert [b.data["obs"].shape.as_list() for b in batches] == [[3, 2, 3], [3, 2, 3], [2, 2, 3]]
    actions = np.concatenate([b.data["action"].numpy() for b in batches])
    assert actions.tolist() == list(range(1, 9))
    assert batches[0].info.key.shape == (3,)


def test_max_samples_ends_the_stream_without_error(server) -> None:
    _write(server.localhost_client(), "u", 4)
    ds = _dataset(_address(server), "u", max_samples=7, rate_limiter_timeout_ms=-1)
    assert len(list(ds)) == 7
    ds = _dataset(_address(server), "u", max_samples=5, num_workers_per_iterator=2)
    assert len(list(ds.batch(2))) == 3


def test_from_table_signature(server) -> None:
    _write(server.localhost_client(), "sig", 3)
    ds = reverb.TrajectoryDataset.from_table_signature(
        _address(server), "sig", max_in_flight_samples_per_worker=2, rate_limiter_timeout_ms=300
    )
    assert ds.element_spec.data == SPEC
    assert [int(s.data["action"]) for s in ds] == [1, 2]
    with pytest.raises(ValueError, match="does not contain any table named nope. Found: q, sig, u"):
        reverb.TrajectoryDataset.from_table_signature(_address(server), "nope", 2)
    with pytest.raises(ValueError, match="Table q at .* does not have a signature"):
        reverb.TrajectoryDataset.from_table_signature(_address(server), "q", 2)


def test_timestep_dataset_emits_one_step_per_element(server) -> None:
    client = server.localhost_client()
    with client.trajectory_writer(3) as w:
        for t in range(6):
            w.append({"x": np.int64(10 * t), "v": np.full([2], t, np.float32)})
            if t % 3 == 2:
                w.create_item("q", 1.0, {"x": w.history["x"][-3:], "v": w.history["v"][-3:]})
        w.flush(timeout_ms=10_000)
    ds = reverb.TimestepDataset(
        _address(server),
        "q",
        dtypes={"x": tf.int64, "v": tf.float32},
        shapes={"x": [], "v": [2]},
        max_in_flight_samples_per_worker=2,
        rate_limiter_timeout_ms=300,
    )
    assert ds.element_spec.data["v"] == tf.TensorSpec([2], tf.float32)
    steps = list(ds)
    assert [int(s.data["x"]) for s in steps] == [0, 10, 20, 30, 40, 50]
    keys = [int(s.info.key) for s in steps]
    assert keys[0] == keys[1] == keys[2] != keys[3] == keys[4] == keys[5]
    np.testing.assert_array_equal(steps[4].data["v"].numpy(), [4, 4])


def test_lists_become_tuples_like_the_reference(server) -> None:
    _write(server.localhost_client(), "q", 2)
    ds = reverb.TrajectoryDataset(
        _address(server),
        "q",
        dtypes=[tf.int32, tf.float32],
        shapes=[[], [2, 3]],
        max_in_flight_samples_per_worker=1,
        rate_limiter_timeout_ms=300,
    )
    (sample,) = list(ds)
    assert isinstance(sample.data, tuple)
    assert int(sample.data[0]) == 1


def test_inside_tf_function(server) -> None:
    _write(server.localhost_client(), "q", 5)
    ds = _dataset(_address(server)).batch(2)

    @tf.function
    def total() -> tf.Tensor:
        s = tf.constant(0, tf.int32)
        for batch in ds:
            s += tf.reduce_sum(batch.data["action"])
        return s

    assert int(total()) == 1 + 2 + 3 + 4


def test_tf1_graph_mode_with_initializable_iterator(server) -> None:
    _write(server.localhost_client(), "q", 5)
    address = _address(server)
    got = []
    with tf.Graph().as_default():
        ds = _dataset(address).batch(2)
        iterator = tf.compat.v1.data.make_initializable_iterator(ds)
        element = iterator.get_next()
        with tf.compat.v1.Session() as sess:
            sess.run(iterator.initializer)
            with pytest.raises(tf.errors.OutOfRangeError):
                while True:
                    got.extend(sess.run(element).data["action"].tolist())
    assert got == [1, 2, 3, 4]


def test_tf1_iterator_methods_as_on_the_references_datasets(server) -> None:
    """The datasets are tf.compat.v1.data.Datasets: TF1 code calls the iterator methods on
    them and on their transformations."""
    _write(server.localhost_client(), "u", 5)
    address = _address(server)
    with tf.Graph().as_default():
        ds = _dataset(address, "u")
        assert isinstance(ds, tf.compat.v1.data.Dataset)
        iterator = ds.make_initializable_iterator()
        element = iterator.get_next()
        batched = ds.batch(2).make_one_shot_iterator().get_next()
        mapped = ds.map(lambda s: s.data["action"]).make_one_shot_iterator().get_next()
        with tf.compat.v1.Session() as sess:
            sess.run(iterator.initializer)
            got = [int(sess.run(element).data["action"]), int(sess.run(mapped))]
            pair = sess.run(batched).data["action"].tolist()
    assert len(pair) == 2 and set(got + pair) <= {1, 2, 3, 4}


@pytest.mark.slow
@pytest.mark.one_path
def test_ends_cleanly_in_tf_data_debug_mode() -> None:
    """tf.data's debug mode runs the pipeline's functions eagerly: the end of the samples
    still ends the dataset (in a fresh process: the mode cannot be turned off)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import numpy as np, tensorflow as tf
        tf.data.experimental.enable_debug_mode()
        import reverb
        server = reverb.Server([reverb.Table.queue("q", 100)])
        client = server.localhost_client()
        for i in range(5):
            client.insert([np.float32(i)], {"q": 1.0})
        ds = reverb.TrajectoryDataset(
            f"localhost:{server.port}", "q", (tf.float32,), (tf.TensorShape([1]),), 4,
            rate_limiter_timeout_ms=300)
        got = [float(s.data[0][0]) for s in ds]
        batched = reverb.TrajectoryDataset(
            f"localhost:{server.port}", "q", (tf.float32,), (tf.TensorShape([1]),), 4,
            rate_limiter_timeout_ms=300).batch(2)
        for i in range(3):
            client.insert([np.float32(i)], {"q": 1.0})
        sizes = [int(b.info.key.shape[0]) for b in batched]
        print("GOT", got, sizes)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("GOT")]
    assert line == "GOT [0.0, 1.0, 2.0, 3.0, 4.0] [2, 1]"


@pytest.mark.slow
@pytest.mark.one_path
def test_under_mirrored_strategy_over_virtual_cpus() -> None:
    """In a fresh process, where a TF1 graph first samples a dataset (as earlier tests of the
    reference's `timestep_dataset_test.py` do), then logical devices are configured (which
    TensorFlow refuses once its runtime has started): 4 virtual CPUs, a MirroredStrategy,
    every step of every item arrives once."""
    import ast
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import numpy as np, tensorflow as tf
        import reverb
        tables = [reverb.Table.queue(name, 100) for name in ("q", "g1", "g2")]
        server = reverb.Server(tables)
        client = server.localhost_client()
        with client.trajectory_writer(1) as w:
            for i in range(3):
                w.append({"x": np.float32(i)})
                w.create_item("g1" if i == 0 else "g2", 1.0, {"x": w.history["x"][-1:]})
        with tf.Graph().as_default():
            for table, batch in (("g1", None), ("g2", 2)):
                ds = reverb.TimestepDataset(
                    f"localhost:{server.port}", table, {"x": tf.float32},
                    {"x": tf.TensorShape([])}, 10, rate_limiter_timeout_ms=500)
                ds = ds if batch is None else ds.batch(batch)
                it = tf.compat.v1.data.make_initializable_iterator(ds)
                with tf.compat.v1.Session() as session:
                    session.run(it.initializer)
                    print("GRAPH", session.run(it.get_next()).data["x"].tolist())
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 4)
        with client.trajectory_writer(2) as w:
            for i in range(40):
                w.append({"x": np.float32(i)})
                if i:
                    w.create_item("q", 1.0, {"x": w.history["x"][-2:]})
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)])
        ds = reverb.TimestepDataset(
            f"localhost:{server.port}", "q", {"x": tf.float32}, {"x": tf.TensorShape([])}, 10,
            rate_limiter_timeout_ms=500).batch(8)
        steps = []
        for batch in strategy.experimental_distribute_dataset(ds):
            for part in strategy.experimental_local_results(batch):
                steps += part.data["x"].numpy().tolist()
        print("STEPS", sorted(steps))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    graph = [x for x in out.stdout.splitlines() if x.startswith("GRAPH")]
    assert graph == ["GRAPH 0.0", "GRAPH [1.0, 2.0]"]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("STEPS")]
    expected = sorted([float(i) for i in range(40) for _ in (0, 1)][1:-1])
    assert ast.literal_eval(line[len("STEPS") :]) == expected


def test_under_tf_distribute(server) -> None:
    _write(server.localhost_client(), "q", 9)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    ds = strategy.experimental_distribute_dataset(_dataset(_address(server)).batch(4))
    with strategy.scope():
        actions = [a for batch in ds for a in batch.data["action"].numpy().tolist()]
    assert actions == list(range(1, 9))


def test_several_iterators_each_have_their_own_sampler(server) -> None:
    client = server.localhost_client()
    for i in range(60):
        client.insert([np.int64(i)], {"q": 1.0})
    ds = reverb.TrajectoryDataset(
        _address(server),
        "q",
        dtypes=[tf.int64],
        shapes=[[1]],
        max_in_flight_samples_per_worker=2,
        rate_limiter_timeout_ms=300,
    )
    first, second = iter(ds), iter(ds)
    a = [int(next(first).data[0][0]) for _ in range(5)]
    b = [int(next(second).data[0][0]) for _ in range(5)]
    rest = [int(s.data[0][0]) for it in (first, second) for s in it]
    assert a == sorted(a) and b == sorted(b)
    assert sorted(a + b + rest) == list(range(60))  # nothing lost or repeated


def test_destroying_an_iterator_stops_its_sampler(server) -> None:
    client = server.localhost_client()
    client.insert([np.int64(0)], {"q": 1.0})
    ds = reverb.TrajectoryDataset(
        _address(server), "q", dtypes=[tf.int64], shapes=[[1]], max_in_flight_samples_per_worker=1
    )
    it = iter(ds)
    assert int(next(it).data[0][0]) == 0
    port = server.metrics_port
    wait_for(lambda: waiting(port, "q", "sample") == 1, 10, "the sampler to wait for more")
    del it
    gc.collect()
    wait_for(lambda: waiting(port, "q", "sample") == 0, 10, "the server to drop the sampler")
    for i in range(1, 6):
        client.insert([np.int64(i)], {"q": 1.0})
    # A sampler still running would have taken one of these.
    got = [int(s[0].data[0]) for s in client.sample("q", num_samples=5, timeout=10)]
    assert got == [1, 2, 3, 4, 5]


def test_dtype_mismatch_names_the_column(server) -> None:
    """The reference's message for a table without a signature, with our column names."""
    _write(server.localhost_client(), "q", 3)
    ds = _dataset(_address(server), dtypes={"obs": tf.float64, "action": tf.int32})
    expected = (
        r"Received incompatible tensor at flattened index 1 from table 'q'.  Specification has "
        r"\(dtype, shape\): \(double, \[2,3\]\).  Tensor has \(dtype, shape\): \(float, \[2,3\]\)."
        r"\nTable signature: 0: Tensor<name: 'action', dtype: int32, shape: \[\]>, "
        r"1: Tensor<name: 'obs', dtype: double, shape: \[2,3\]>"
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=expected):
        next(iter(ds))


def test_a_failed_iterator_takes_no_more_items(server) -> None:
    """After a sample that does not fit the declared spec, the (still alive) iterator's sampler
    stops at once: items inserted next go to other samplers, and the iterator keeps failing."""
    client = server.localhost_client()
    _write(client, "q", 3)
    ds = _dataset(
        _address(server),
        dtypes={"obs": tf.float64, "action": tf.int32},
        rate_limiter_timeout_ms=60_000,
    )
    it = iter(ds)
    with pytest.raises(tf.errors.InvalidArgumentError, match="incompatible tensor"):
        next(it)
    port = server.metrics_port
    wait_for(lambda: waiting(port, "q", "sample") == 0, 10, "the failed sampler to stop")
    for i in range(5):
        client.insert([np.int64(i)], {"q": 1.0})
    got = [int(s[0].data[0]) for s in client.sample("q", num_samples=5, timeout=10)]
    assert got == [0, 1, 2, 3, 4]
    with pytest.raises(tf.errors.InvalidArgumentError, match="incompatible tensor"):
        next(it)
    assert server.localhost_client().server_info()["q"].current_size == 0
    del it


def test_shape_mismatch_names_the_column(server) -> None:
    _write(server.localhost_client(), "q", 3)
    ds = _dataset(_address(server), shapes={"obs": [2, 4], "action": []})
    message = r"(?s)\(float, \[2,4\]\).*\(float, \[2,3\]\).*name: 'obs'"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        next(iter(ds))


@pytest.mark.parametrize("cls", ["TrajectoryDataset", "TimestepDataset"])
def test_requests_that_do_not_fit_the_signature_are_refused_before_sampling(server, cls) -> None:
    """Against a table with a signature the declared columns are checked before any item is
    sampled (nothing is taken from the queue), with the reference's messages."""
    _write(server.localhost_client(), "sig", 3)
    make = getattr(reverb, cls)
    common = dict(max_in_flight_samples_per_worker=4, rate_limiter_timeout_ms=300)
    table_signature = (
        r"Table signature: 0: Tensor<name: 'action', dtype: int32, shape: \[\]>, "
        r"1: Tensor<name: 'obs', dtype: float, shape: \[2,3\]>"
    )
    wrong_dtype = make(
        _address(server), "sig", dtypes=(tf.int64, tf.float32), shapes=([], [2, 3]), **common
    )
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Requested incompatible tensor at flattened index 0 from table 'sig'.  Requested "
        r"\(dtype, shape\): \(int64, \[\]\).  Signature \(dtype, shape\): \(int32, \[\]\).  "
        + table_signature,
    ):
        next(iter(wrong_dtype))
    wrong_shape = make(
        _address(server), "sig", dtypes=(tf.int32, tf.float32), shapes=([], [3]), **common
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"index 1 .*\(float, \[3\]\)"):
        next(iter(wrong_shape))
    too_many = make(_address(server), "sig", dtypes=(tf.int32,) * 3, shapes=([], [], []), **common)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"Inconsistent number of tensors requested from table 'sig'.  Requested 3 tensors, "
        r"but table signature shows 2 tensors.  " + table_signature,
    ):
        next(iter(too_many))
    assert server.localhost_client().server_info()["sig"].current_size == 2


def test_autograph_leaves_our_dataset_code_alone(server) -> None:
    """Built inside a tf.data function (as Acme's make_reverb_dataset does), whose code
    autograph converts, our dataset code is called as it is: converting it cost seconds."""
    from tensorflow.python.autograph.impl import conversion

    from reverb import _dataset

    assert conversion.is_allowlisted(_dataset.build)
    assert conversion.is_allowlisted(reverb.TrajectoryDataset.from_table_signature)
    assert conversion.is_allowlisted(reverb.TFClient.sample)
    _write(server.localhost_client(), "sig", 3)

    def make(_):
        ds = reverb.TrajectoryDataset.from_table_signature(
            _address(server), "sig", 4, rate_limiter_timeout_ms=300
        )
        return ds.batch(2, drop_remainder=True)

    ds = tf.data.Dataset.range(1).interleave(make, cycle_length=1)
    (batch,) = list(ds)
    assert batch.data["obs"].shape == (2, 2, 3)


@pytest.mark.parametrize("cls", ["TrajectoryDataset", "TimestepDataset"])
def test_server_address_and_table_may_be_tensors(server, cls) -> None:
    """As the reference's: string tensors for the address and table, constant (eager), known
    only when a tf.function runs (its arguments), or fed to a TF1 placeholder."""
    make = getattr(reverb, cls)
    step = cls == "TimestepDataset"
    shapes = {"obs": [3] if step else [2, 3], "action": []}
    client = server.localhost_client()

    def dataset(address, table):
        return make(
            address,
            table,
            dtypes={"obs": tf.float32, "action": tf.int32},
            shapes=shapes,
            max_in_flight_samples_per_worker=4,
            rate_limiter_timeout_ms=300,
        )

    def first_obs(sample) -> list:
        return np.asarray(sample.data["obs"]).tolist()

    if step:
        client.insert({"obs": np.full([3], 5, np.float32), "action": np.int32(5)}, {"u": 1.0})
        want = [5.0, 5.0, 5.0]
    else:
        _write(client, "u", 2)
        want = [[0.0] * 3, [1.0] * 3]
    address = tf.constant(_address(server))
    assert first_obs(next(iter(dataset(address, tf.constant("u"))))) == want

    @tf.function
    def sample(address, table):
        return next(iter(dataset(address, table))).data["obs"]

    got = sample(tf.constant(_address(server)), tf.constant("u"))
    assert got.numpy().tolist() == want
    with tf.Graph().as_default():
        fed = tf.compat.v1.placeholder(tf.string, [])
        ds = dataset(fed, "u")
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        element = it.get_next()
        with tf.compat.v1.Session() as session:
            session.run(it.initializer, {fed: _address(server)})
            assert first_obs(session.run(element)) == want
    with pytest.raises(ValueError, match="scalar string tensor"):
        dataset(tf.constant([_address(server)] * 2)[tf.newaxis], "u")


def test_a_reinitialized_iterator_follows_its_new_feed(server) -> None:
    """A TF1 initializable iterator whose table is a placeholder samples the table fed at each
    initialization."""
    client = server.localhost_client()
    client.insert({"obs": np.zeros([2, 3], np.float32), "action": np.int32(7)}, {"u": 1.0})
    _write(client, "q", 2)
    with tf.Graph().as_default():
        table = tf.compat.v1.placeholder(tf.string, [])
        ds = _dataset(_address(server), table, shapes={"obs": None, "action": None})
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        element = it.get_next()
        with tf.compat.v1.Session() as session:
            session.run(it.initializer, {table: "u"})
            assert session.run(element).data["action"].ravel().tolist() == [7]
            session.run(it.initializer, {table: "q"})
            assert session.run(element).data["action"].ravel().tolist() == [1]


def test_unknown_dims_are_accepted(server) -> None:
    _write(server.localhost_client(), "q", 3)
    ds = _dataset(_address(server), shapes={"obs": [None, 3], "action": None})
    assert ds.element_spec.data["obs"].shape.as_list() == [None, 3]
    assert [int(s.data["action"]) for s in ds] == [1, 2]


def test_unknown_table_is_not_found(server) -> None:
    with pytest.raises(tf.errors.NotFoundError, match="nope"):
        next(iter(_dataset(_address(server), "nope")))


def test_unreachable_server_fails_within_seconds(monkeypatch) -> None:
    # A dataset waits for an unreachable server this long, then fails.
    monkeypatch.setenv("REVERB_CONNECT_WAIT_SECONDS", "2")
    with reverb.Server([_queue()]) as s:
        address = _address(s)
    start = time.monotonic()
    # TensorFlow turns UNAVAILABLE from a non-communication op into INTERNAL.
    with pytest.raises((tf.errors.UnavailableError, tf.errors.InternalError), match=address):
        next(iter(_dataset(address, rate_limiter_timeout_ms=-1)))
    # (Once: the signature check and the sampler share the wait.)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_in_flight_samples_per_worker=0), "max_in_flight_samples_per_worker"),
        (dict(num_workers_per_iterator=0), "num_workers_per_iterator"),
        (dict(max_samples_per_stream=-2), "max_samples_per_stream"),
        (dict(max_samples=0), "max_samples"),
        (dict(rate_limiter_timeout_ms=-2), "rate_limiter_timeout_ms"),
        (dict(shapes={"obs": [2, 3]}), "same structure"),
        (dict(shapes=[[2, 3], []]), "same structure"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _dataset("localhost:1", **kwargs)


def test_string_tensor_arguments(server) -> None:
    _write(server.localhost_client(), "q", 3)
    ds = _dataset(tf.constant(_address(server)), tf.constant("q"))
    assert len(list(ds)) == 2


def test_batch_is_done_in_the_kernel_with_tf_batch_semantics(server) -> None:
    client = server.localhost_client()
    _write(client, "q", 11)
    ds = _dataset(_address(server)).batch(4)
    assert ds.element_spec.data["obs"].shape.as_list() == [None, 2, 3]
    batches = list(ds)
    assert [b.data["action"].numpy().tolist() for b in batches] == [
        [1, 2, 3, 4],
        [5, 6, 7, 8],
        [9, 10],
    ]
    assert [b.info.key.shape[0] for b in batches] == [4, 4, 2]
    _write(client, "q", 11)
    ds = _dataset(_address(server)).batch(4, drop_remainder=True)
    assert ds.element_spec.data["obs"].shape.as_list() == [4, 2, 3]
    assert ds.element_spec.info.key.shape.as_list() == [4]
    assert [b.data["action"].numpy().tolist() for b in ds] == [[1, 2, 3, 4], [5, 6, 7, 8]]


@contextlib.contextmanager
def _trickling(client: reverb.Client, steps: int):
    """Writes `_write`'s items into "q" from a thread, one every 0.25 s: longer than one
    kernel call waits, so calls return zero rows in between."""

    def trickle() -> None:
        with client.trajectory_writer(2) as w:
            for t in range(steps):
                w.append({"obs": np.full([3], t, np.float32), "action": np.int32(t)})
                if t >= 1:
                    time.sleep(0.25)
                    w.create_item(
                        "q", 1.0, {"obs": w.history["obs"][-2:], "action": w.history["action"][-1]}
                    )
                    w.flush(timeout_ms=10_000)

    writer = threading.Thread(target=trickle)
    writer.start()
    try:
        yield
    finally:
        writer.join()


@pytest.mark.parametrize(
    "shapes, drop_remainder",
    [
        ({"obs": [2, 3], "action": []}, False),
        ({"obs": [2, 3], "action": []}, True),
        # Shapes not fully known take another way past the calls that returned nothing.
        ({"obs": [None, 3], "action": None}, False),
    ],
)
def test_batches_are_whole_when_items_trickle_in(server, shapes, drop_remainder) -> None:
    """Items come slower than a kernel call waits, so calls return zero rows in between:
    the batches are the same as when every item is already there."""
    with _trickling(server.localhost_client(), 6):
        ds = _dataset(_address(server), shapes=shapes, rate_limiter_timeout_ms=1000)
        batches = list(ds.batch(2, drop_remainder=drop_remainder))
    got = [b.data["action"].numpy().tolist() for b in batches]
    assert got == ([[1, 2], [3, 4]] if drop_remainder else [[1, 2], [3, 4], [5]])
    for b in batches:
        actions = b.data["action"].numpy()
        obs = [[np.full([3], a - 1), np.full([3], a)] for a in actions]
        np.testing.assert_array_equal(b.data["obs"].numpy(), np.array(obs, np.float32))
        assert b.info.key.shape[0] == len(actions)


def test_batches_are_whole_under_a_single_replica_strategy(server) -> None:
    """tf.distribute auto-shards the dataset even for one replica (and would rewrite a final
    rebatch into one that passes the calls' zero rows on)."""
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with _trickling(server.localhost_client(), 6):
        ds = _dataset(_address(server), rate_limiter_timeout_ms=1000).batch(2, True)
        got = [
            b.data["action"].numpy().tolist() for b in strategy.experimental_distribute_dataset(ds)
        ]
    assert got == [[1, 2], [3, 4]]


def test_a_dataset_made_in_a_graph_is_built_there_when_first_used_in_a_function(server) -> None:
    _write(server.localhost_client(), "q", 4)
    with tf.Graph().as_default():
        ds = _dataset(_address(server))
        # First used inside a function of the graph, then by an iterator of the graph itself.
        nested = tf.compat.v1.data.Dataset.range(1).flat_map(lambda _: ds)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        element = it.get_next()
        with tf.compat.v1.Session() as session:
            session.run(it.initializer)
            got = [int(session.run(element).data["action"]) for _ in range(3)]
    assert got == [1, 2, 3]
    assert nested.element_spec == ds.element_spec


def test_batch_of_items_with_different_shapes_fails_clearly(server) -> None:
    client = server.localhost_client()
    with client.trajectory_writer(3) as w:
        for t in range(3):
            w.append({"x": np.float32(t)})
        w.create_item("q", 1.0, {"x": w.history["x"][-2:]})
        w.create_item("q", 1.0, {"x": w.history["x"][-3:]})
        w.flush(timeout_ms=10_000)
    ds = reverb.TrajectoryDataset(
        _address(server),
        "q",
        dtypes={"x": tf.float32},
        shapes={"x": [None]},
        max_in_flight_samples_per_worker=2,
        rate_limiter_timeout_ms=300,
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="different shapes"):
        list(ds.batch(2))
