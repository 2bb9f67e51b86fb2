"""TrajectoryIterator: the prefetching sampler as a numpy iterator (no TensorFlow)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from _metrics import waiting
from _wait import wait_for

import reverb
from reverb import rate_limiters, selectors

T = 10.0


# Every test runs twice: through this process's server directly, and over gRPC.
pytestmark = pytest.mark.usefixtures("both_paths")


def _fill(client: reverb.Client, table: str, n: int) -> None:
    with client.trajectory_writer(2) as writer:
        for t in range(n + 1):
            writer.append({"obs": np.full(3, t, np.float32), "t": np.int64(t)})
            if t:
                writer.create_item(
                    table, 1.0, {"obs": writer.history["obs"][-2:], "t": writer.history["t"][-1]}
                )


def test_batches_stack_columns_and_info(make_server) -> None:
    table = reverb.Table(
        "t", selectors.Fifo(), selectors.Fifo(), 100, rate_limiters.MinSize(1), max_times_sampled=1
    )
    server = make_server([table])
    _fill(server.localhost_client(), "t", 10)
    address = f"localhost:{server.port}"
    with reverb.TrajectoryIterator(address, "t", batch_size=4, max_samples=10) as it:
        batches = list(it)
    assert [len(b.info.key) for b in batches] == [4, 4, 2]
    first = batches[0]
    assert first.info.key.dtype == np.uint64 and first.info.times_sampled.dtype == np.int32
    assert first.info.probability.dtype == np.float64 and first.info.table_size.dtype == np.int64
    obs, t = first.data
    assert obs.shape == (4, 2, 3) and obs.dtype == np.float32
    assert t.shape == (4,) and t.tolist() == [1, 2, 3, 4]
    np.testing.assert_array_equal(obs[:, :, 0], [[0, 1], [1, 2], [2, 3], [3, 4]])
    assert np.concatenate([b.data[1] for b in batches]).tolist() == list(range(1, 11))


def test_unbatched_samples_and_rate_limiter_timeout_ends_cleanly(make_server) -> None:
    server = make_server([reverb.Table.queue("q", 10)])
    _fill(server.localhost_client(), "q", 3)
    it = reverb.TrajectoryIterator(f"localhost:{server.port}", "q", rate_limiter_timeout_ms=200)
    start = time.monotonic()
    samples = list(it)
    assert time.monotonic() - start < 5
    assert [int(s.data[1]) for s in samples] == [1, 2, 3]
    assert isinstance(samples[0].info.key, int) and samples[0].info.times_sampled == 1


def test_many_workers_respect_max_samples(make_server) -> None:
    table = reverb.Table("u", selectors.Uniform(), selectors.Fifo(), 100, rate_limiters.MinSize(1))
    server = make_server([table])
    _fill(server.localhost_client(), "u", 20)
    it = reverb.TrajectoryIterator(
        f"localhost:{server.port}",
        "u",
        batch_size=7,
        max_samples=50,
        num_workers_per_iterator=3,
        max_in_flight_samples_per_worker=8,
    )
    assert sum(len(b.info.key) for b in it) == 50
    assert (
        server.localhost_client()
        .server_info(timeout=T)["u"]
        .rate_limiter_info.sample_stats.completed
        == 50
    )


def test_errors_and_arguments(make_server) -> None:
    server = make_server([reverb.Table.queue("q", 10)])
    address = f"localhost:{server.port}"
    with pytest.raises(reverb.errors.NotFoundError, match="nope"):
        next(reverb.TrajectoryIterator(address, "nope"))
    for kwargs in (
        {"batch_size": 0},
        {"max_in_flight_samples_per_worker": 0},
        {"max_samples": 0},
        {"num_workers_per_iterator": -2},
        {"rate_limiter_timeout_ms": -5},
    ):
        with pytest.raises(ValueError):
            reverb.TrajectoryIterator(address, "q", **kwargs)


def test_closing_a_blocked_iterator_stops_its_workers(make_server) -> None:
    server = make_server([reverb.Table.queue("q", 10)], metrics_port=0)
    port = server.metrics_port
    it = reverb.TrajectoryIterator(f"localhost:{server.port}", "q")
    got = []
    thread = threading.Thread(target=lambda: got.extend(it), daemon=True)
    thread.start()
    wait_for(lambda: waiting(port, "q", "sample") >= 1, T, "the iterator's samples to block")
    it.close()
    thread.join(5)
    assert not thread.is_alive() and got == []
    # (The cancellation reaches the server asynchronously.)
    wait_for(lambda: waiting(port, "q", "sample") == 0, T, "the server to drop the samples")
    # Nothing is taken from the table by the closed iterator (a time, for a negative).
    server.localhost_client().insert(np.int64(1), {"q": 1.0}, timeout=T)
    time.sleep(0.2)
    assert server.localhost_client().server_info(timeout=T)["q"].current_size == 1


@pytest.mark.parametrize("batch_size", [5, None])
def test_a_consumer_that_works_between_elements_gets_each_sample_once_in_order(
    make_server, batch_size
) -> None:
    # A consumer spending time with each element has the next assembled ahead: the elements
    # are still the table's items, each once, in FIFO order, up to max_samples.
    table = reverb.Table(
        "t", selectors.Fifo(), selectors.Fifo(), 100, rate_limiters.MinSize(1), max_times_sampled=1
    )
    server = make_server([table])
    _fill(server.localhost_client(), "t", 40)
    address = f"localhost:{server.port}"
    seen = []
    with reverb.TrajectoryIterator(address, "t", batch_size=batch_size, max_samples=40) as it:
        for element in it:
            seen.extend(np.atleast_1d(element.data[1]).tolist())
            time.sleep(0.01)  # a learner's step
    assert seen == list(range(1, 41))
    assert server.localhost_client().server_info(timeout=T)["t"].current_size == 0


def test_closing_an_iterator_assembling_ahead_stops_it(make_server) -> None:
    # After elements taken slowly (so the next is assembled ahead), the table runs dry: the
    # element being assembled waits on the table; closing the iterator stops that too.
    server = make_server([reverb.Table.queue("q", 100)], metrics_port=0)
    port = server.metrics_port
    _fill(server.localhost_client(), "q", 6)
    it = reverb.TrajectoryIterator(f"localhost:{server.port}", "q", batch_size=2)
    for _ in range(3):
        assert len(next(it).info.key) == 2
        time.sleep(0.05)
    wait_for(lambda: waiting(port, "q", "sample") >= 1, T, "the samples ahead to block")
    it.close()
    wait_for(lambda: waiting(port, "q", "sample") == 0, T, "the server to drop the samples")
    server.localhost_client().insert(np.int64(1), {"q": 1.0}, timeout=T)
    time.sleep(0.2)
    assert server.localhost_client().server_info(timeout=T)["q"].current_size == 1


@pytest.mark.parametrize("compressible", [True, False])
def test_batches_of_items_sharing_chunks_hold_each_items_own_rows(
    make_server, compressible
) -> None:
    """Items of 5 steps, one per step, in chunks of 20 steps: a batch's items share chunks
    (a compressed chunk is decoded once per batch; a stored one is read in place) and each
    row must still be its own item's. `t` names the step; compressible steps are constant
    rows, others random bytes remembered per step."""
    table = reverb.Table("t", selectors.Uniform(), selectors.Fifo(), 1000, rate_limiters.MinSize(1))
    server = make_server([table])
    client = server.localhost_client()
    rng = np.random.default_rng(7)
    frames = {}
    with client.trajectory_writer(num_keep_alive_refs=20) as writer:
        for t in range(300):
            frame = (
                np.full(64, t % 251, np.uint8)
                if compressible
                else rng.integers(0, 255, 64, np.uint8)
            )
            frames[t] = frame
            writer.append({"frame": frame, "t": np.int64(t)})
            if writer.episode_steps >= 5:
                history = writer.history
                writer.create_item(
                    "t", 1.0, {"frame": history["frame"][-5:], "t": history["t"][-5:]}
                )
        writer.flush()
    address = f"localhost:{server.port}"
    with reverb.TrajectoryIterator(address, "t", batch_size=64, max_samples=640) as it:
        batches = list(it)
    assert len(batches) == 10
    for batch in batches:
        got, ts = batch.data  # (flattened: frame, t)
        assert ts.shape == (64, 5) and got.shape == (64, 5, 64)
        for steps, rows in zip(ts, got):
            assert list(steps) == list(range(steps[0], steps[0] + 5))
            np.testing.assert_array_equal(rows, np.stack([frames[int(s)] for s in steps]))
