"""Batches as columns over gRPC: a sampler that stacks its batches asks our server for each
draw gathered into columns (`SampleStreamRequest.columnar`); what cannot be gathered (delta
encoding, strings) comes as entries, and a batch may mix both. Every row must hold what was
written, with its info."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reverb
from reverb import rate_limiters, selectors


@pytest.fixture(autouse=True, scope="module")
def _over_grpc():
    """Every test here samples over loopback gRPC, not in place."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("REVERB_NO_INPROC", "1")
        yield


def _step(t: int, dtype: str, shape: tuple, compressible: bool) -> np.ndarray:
    """Step `t`'s observation: the same for the same arguments."""
    if compressible:
        return np.full(shape, t % 100, dtype)
    rng = np.random.default_rng(t)
    return (rng.random(shape) * 100).astype(dtype)


@settings(max_examples=12, deadline=None)
@given(
    dtype=st.sampled_from(["float32", "int64", "uint8"]),
    shape=st.lists(st.integers(0, 3), max_size=2).map(tuple),
    length=st.integers(1, 3),
    chunk=st.integers(1, 4),
    compressible=st.booleans(),
    delta=st.sampled_from(["none", "some", "all"]),
    batch=st.integers(1, 9),
)
def test_rows_hold_what_was_written(dtype, shape, length, chunk, compressible, delta, batch):
    table = reverb.Table("t", selectors.Uniform(), selectors.Fifo(), 1000, rate_limiters.MinSize(1))
    with reverb.Server([table]) as server:
        client = reverb.Client(f"localhost:{server.port}")
        steps = 30
        # Items written by a delta-encoding writer cannot be gathered: entries.
        delta_episode = {"none": [False, False], "some": [False, True], "all": [True, True]}
        for episode, encoded in enumerate(delta_episode[delta]):
            with client.trajectory_writer(max(chunk, length), delta_encode=encoded) as writer:
                for i in range(steps):
                    t = episode * steps + i
                    writer.append({"obs": _step(t, dtype, shape, compressible), "t": np.int64(t)})
                    if i + 1 >= length:
                        obs = writer.history["obs"]
                        writer.create_item(
                            "t",
                            float(t + 1),
                            {
                                "obs": obs[-1] if length == 1 else obs[-length:],
                                "t": writer.history["t"][-1],
                            },
                        )
                writer.end_episode()
        size = 2 * (steps - length + 1)
        address = f"localhost:{server.port}"
        with reverb.TrajectoryIterator(address, "t", batch_size=batch, max_samples=4 * batch) as it:
            got = list(it)
        assert sum(len(b.info.key) for b in got) == 4 * batch
        for b in got:
            obs, ts = b.data
            assert obs.dtype == np.dtype(dtype) and ts.dtype == np.int64
            rows = len(ts)
            want_shape = (rows, *shape) if length == 1 else (rows, length, *shape)
            assert obs.shape == want_shape
            for i, t in enumerate(ts.tolist()):
                want = [_step(s, dtype, shape, compressible) for s in range(t - length + 1, t + 1)]
                np.testing.assert_array_equal(obs[i], want[0] if length == 1 else np.stack(want))
                assert b.info.priority[i] == t + 1
                assert b.info.table_size[i] == size
                assert b.info.probability[i] == pytest.approx(1 / size)
                assert b.info.times_sampled[i] >= 1
            assert len(set(b.info.key.tolist())) == len(set(ts.tolist()))


def test_string_columns_come_as_entries() -> None:
    with reverb.Server([reverb.Table.queue("q", 10)]) as server:
        client = reverb.Client(f"localhost:{server.port}")
        with client.trajectory_writer(1) as writer:
            for t in range(4):
                writer.append({"name": np.array(f"step {t}", object), "t": np.int32(t)})
                writer.create_item("q", 1.0, {k: v[-1] for k, v in writer.history.items()})
        with reverb.TrajectoryIterator(
            f"localhost:{server.port}", "q", batch_size=2, max_samples=4
        ) as it:
            batches = list(it)
        names = [n.decode() if isinstance(n, bytes) else n for b in batches for n in b.data[0]]
        assert names == [f"step {t}" for t in range(4)]
        assert [t for b in batches for t in b.data[1].tolist()] == [0, 1, 2, 3]


def test_items_of_different_shapes_are_refused_as_before() -> None:
    with reverb.Server([reverb.Table.queue("q", 10)]) as server:
        client = reverb.Client(f"localhost:{server.port}")
        with client.trajectory_writer(3) as writer:
            for t in range(3):
                writer.append({"x": np.float32(t)})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-1:]})
            writer.create_item("q", 1.0, {"x": writer.history["x"][-2:]})
        with reverb.TrajectoryIterator(
            f"localhost:{server.port}", "q", batch_size=2, max_samples=2
        ) as it:
            with pytest.raises(Exception, match="cannot be batched"):
                next(it)


@pytest.mark.parametrize("batch", [None, 8])
def test_tf_datasets_read_rows(batch) -> None:
    """`TrajectoryDataset` (one sample per element, or a fused `.batch`) and
    `TimestepDataset` take rows of columns as they take entries."""
    tf = pytest.importorskip("tensorflow")
    tables = [
        reverb.Table(name, selectors.Uniform(), selectors.Fifo(), 100, rate_limiters.MinSize(1))
        for name in ("u", "s")
    ]
    with reverb.Server(tables) as server:
        client = reverb.Client(f"localhost:{server.port}")

        def write(table: str, t_steps: slice | int) -> None:
            """Items of two steps' obs and `t_steps` of t, one per step after the first."""
            with client.trajectory_writer(2) as writer:
                for t in range(41):
                    writer.append({"obs": _step(t, "float32", (3,), False), "t": np.int64(t)})
                    if t:
                        history = writer.history
                        writer.create_item(
                            table, 1.0, {"obs": history["obs"][-2:], "t": history["t"][t_steps]}
                        )

        write("u", -1)
        address = f"localhost:{server.port}"
        kwargs = dict(
            dtypes=(tf.float32, tf.int64),
            shapes=(tf.TensorShape([2, 3]), tf.TensorShape([])),
            max_in_flight_samples_per_worker=16,
        )
        ds = reverb.TrajectoryDataset(address, "u", **kwargs)
        if batch:
            ds = ds.batch(batch)
        for sample in ds.take(6):
            obs, ts = (x.numpy() for x in sample.data)
            obs, ts = (obs, ts) if batch else (obs[None], ts[None])
            assert len(ts) == (batch or 1)
            for o, t in zip(obs, ts.tolist()):
                np.testing.assert_array_equal(
                    o,
                    np.stack(
                        [_step(t - 1, "float32", (3,), False), _step(t, "float32", (3,), False)]
                    ),
                )
            assert (sample.info.table_size.numpy() == 40).all()
        # Items whose columns all have a time dimension, for steps.
        write("s", slice(-2, None))
        steps = reverb.TimestepDataset(
            address,
            "s",
            dtypes=(tf.float32, tf.int64),
            shapes=(tf.TensorShape([3]), tf.TensorShape([])),
            max_in_flight_samples_per_worker=16,
        )
        got = [(int(s.info.key), s.data) for s in steps.take(20)]
        # Each item's two steps, one after the other.
        for (key_a, (obs_a, t_a)), (key_b, (obs_b, t_b)) in zip(got[::2], got[1::2]):
            assert key_a == key_b and int(t_b) == int(t_a) + 1
            np.testing.assert_array_equal(obs_a.numpy(), _step(int(t_a), "float32", (3,), False))
            np.testing.assert_array_equal(obs_b.numpy(), _step(int(t_b), "float32", (3,), False))
