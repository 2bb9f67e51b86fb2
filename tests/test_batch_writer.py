"""Client.batch_writer (beyond the reference): batches of steps as items, as
`Client.insert_steps` stores them, with several batches in flight on a stream of the writer's
own; refusals, restarts and timeouts lose nothing the server stored and store nothing twice."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from _wait import answers, wait_for

import reverb
from reverb import rate_limiters, selectors

T = 10.0

# Every test runs twice: through this process's server directly, and over gRPC.
pytestmark = pytest.mark.usefixtures("both_paths")


def _queue_values(client: reverb.Client, table: str, n: int) -> list:
    """The `n` oldest items of a queue as (priority, its step's leaves)."""
    return [(s[0].info.priority, s[0].data) for s in client.sample(table, n, timeout=T)]


def _flushed_while_read(
    client: reverb.Client, writer: reverb.BatchWriter, table: str, n: int
) -> list:
    """Flushes `writer` while another thread takes `n` items from queue `table` (making room
    for what is blocked); the first value of each item taken, in order."""
    got: list = []
    reader = threading.Thread(
        target=lambda: got.extend(int(s[0].data[0]) for s in client.sample(table, n, timeout=T))
    )
    reader.start()
    writer.flush(timeout_ms=int(T * 1000))
    reader.join(T)
    return got


def _prioritized(name: str, max_size: int = 1000) -> reverb.Table:
    return reverb.Table(
        name, selectors.Prioritized(1.0), selectors.Fifo(), max_size, rate_limiters.MinSize(1)
    )


def test_batches_of_any_size_arrive_whole_and_in_order(make_server) -> None:
    server = make_server([reverb.Table.queue("q", 5000), reverb.Table.queue("r", 5000)])
    client = reverb.Client(f"localhost:{server.port}")
    expected = []
    at = 0
    with client.batch_writer(max_in_flight_items=600) as writer:
        for n in [1, 300, 7, 700, 256, 2, 500]:
            values = np.arange(at, at + n, dtype=np.int64)
            obs = np.stack([values.astype(np.float32)] * 3, axis=1)
            writer.insert_steps({"i": values, "obs": obs}, {"q": values + 0.5, "r": 1.0})
            # (N steps are N items in each of the two tables.)
            assert writer.num_unconfirmed_items <= max(600, 2 * n)
            expected += values.tolist()
            at += n
    info = client.server_info(timeout=T)
    assert info["q"].current_size == len(expected) == info["r"].current_size
    got = _queue_values(client, "q", len(expected))
    assert [int(d[0]) for _, d in got] == expected
    assert [p for p, _ in got] == [v + 0.5 for v in expected]
    for v, (_, (_, obs)) in zip(expected, got):
        np.testing.assert_array_equal(obs, [v, v, v])
    assert [int(d[0]) for _, d in _queue_values(client, "r", len(expected))] == expected


def test_calls_return_while_the_server_stores(make_server, both_paths) -> None:
    """Over gRPC a call returns once its batch is sent: with the queue full, five batches of
    256 go out (1,024 unconfirmed), the sixth waits for room and times out unsent. Once a
    reader makes room, a flush sees all five stored, in order. (A server of this process
    stores each batch before the call returns.)"""
    if both_paths != "grpc":
        pytest.skip("a server of this process stores each batch in the call")
    server = make_server([reverb.Table.queue("q", 300)])
    client = reverb.Client(f"localhost:{server.port}")
    writer = client.batch_writer(max_in_flight_items=1024)
    start = time.monotonic()
    for b in range(5):
        writer.insert_steps({"v": np.arange(b * 256, (b + 1) * 256)}, {"q": 1.0}, timeout=T)
    assert time.monotonic() - start < T / 2
    assert writer.num_unconfirmed_items == 1024  # (the first batch is confirmed)
    with pytest.raises(reverb.errors.DeadlineExceededError):
        writer.insert_steps({"v": np.arange(-256, 0)}, {"q": 1.0}, timeout=0.3)
    with pytest.raises(reverb.errors.DeadlineExceededError, match="stay in flight"):
        writer.flush(timeout_ms=200)
    assert _flushed_while_read(client, writer, "q", 1280) == list(range(1280))
    assert writer.num_unconfirmed_items == 0
    writer.close()


def test_a_refused_batch_fails_a_later_call_and_those_after_it_go_again(make_server) -> None:
    server = make_server([_prioritized("p")])
    client = reverb.Client(f"localhost:{server.port}")
    writer = client.batch_writer()
    writer.insert_steps({"v": np.arange(4)}, {"p": 1.0}, timeout=T)
    writer.insert_steps({"v": np.arange(4, 8)}, {"p": [1.0, -1.0, 1.0, 1.0]}, timeout=T)
    writer.insert_steps({"v": np.arange(10, 14)}, {"p": 2.0}, timeout=T)
    with pytest.raises(ValueError, match=r"Priority -1.0 is not valid.*refused 4 items of a batch"):
        writer.flush(timeout_ms=int(T * 1000))
    writer.flush(timeout_ms=int(T * 1000))
    assert writer.num_unconfirmed_items == 0
    info = client.server_info(timeout=T)["p"]
    assert info.current_size == 8
    assert info.rate_limiter_info.insert_stats.completed == 8
    got = client.sample("p", 200, timeout=T)
    assert {int(s[0].data[0]) for s in got} == {0, 1, 2, 3, 10, 11, 12, 13}
    writer.insert_steps({"v": np.arange(20, 22)}, {"p": 1.0}, timeout=T)
    writer.flush(timeout_ms=int(T * 1000))
    assert client.server_info(timeout=T)["p"].current_size == 10
    writer.close()


def test_sent_batches_reach_the_server_without_a_wait(make_server) -> None:
    """Sent means sent: the server stores a batch while the writer waits for nothing."""
    server = make_server([reverb.Table.queue("q", 100)])
    client = reverb.Client(f"localhost:{server.port}")
    writer = client.batch_writer()
    writer.insert_steps({"v": np.arange(10)}, {"q": 1.0}, timeout=T)
    wait_for(lambda: client.server_info(timeout=T)["q"].current_size == 10, T, "the batch")
    assert [int(d[0]) for _, d in _queue_values(client, "q", 10)] == list(range(10))
    writer.close()


def test_refusals_in_a_flush_and_in_a_with_block_lose_no_other_batch(make_server) -> None:
    server = make_server([_prioritized("p")])
    client = reverb.Client(f"localhost:{server.port}")
    good = [np.arange(i * 10, i * 10 + 3) for i in range(4)]
    writer = client.batch_writer()
    writer.insert_steps({"v": good[0]}, {"p": 1.0}, timeout=T)
    writer.insert_steps({"v": np.arange(100, 103)}, {"p": -1.0}, timeout=T)
    writer.insert_steps({"v": good[1]}, {"p": 1.0}, timeout=T)
    writer.insert_steps({"v": np.arange(200, 203)}, {"p": -2.0}, timeout=T)
    writer.insert_steps({"v": good[2]}, {"p": 1.0}, timeout=T)
    with pytest.raises(ValueError, match="Priority -1.0 is not valid"):
        writer.flush(timeout_ms=int(T * 1000))
    assert writer.num_unconfirmed_items == 0  # (the second refusal was learned meanwhile)
    with pytest.raises(ValueError, match="Priority -3.0 is not valid"):
        with client.batch_writer() as other:
            other.insert_steps({"v": np.arange(300, 303)}, {"p": -3.0}, timeout=T)
            other.insert_steps({"v": good[3]}, {"p": 1.0}, timeout=T)
    info = client.server_info(timeout=T)["p"]
    assert info.current_size == 12
    got = {int(s[0].data[0]) for s in client.sample("p", 500, timeout=T)}
    assert got == set(np.concatenate(good).tolist())


def test_a_refusal_then_a_timed_out_flush_says_both_and_keeps_the_rest(make_server) -> None:
    """A flush learns of a refusal, then times out on a batch blocked in a full queue: its
    error says both, and the blocked batch stays in flight until a reader makes room."""
    server = make_server([_prioritized("p"), reverb.Table.queue("q", 2)])
    client = reverb.Client(f"localhost:{server.port}")
    writer = client.batch_writer()
    writer.insert_steps({"v": np.arange(2)}, {"q": 1.0}, timeout=T)
    writer.insert_steps({"v": np.arange(3)}, {"p": -1.0}, timeout=T)
    writer.insert_steps({"v": np.arange(10, 13)}, {"q": 1.0}, timeout=T)
    with pytest.raises(
        reverb.errors.DeadlineExceededError, match=r"stay in flight.*Priority -1.0 is not valid"
    ):
        writer.flush(timeout_ms=500)
    assert writer.num_unconfirmed_items == 3
    assert _flushed_while_read(client, writer, "q", 5) == [0, 1, 10, 11, 12]
    assert client.server_info(timeout=T)["p"].current_size == 0
    writer.close()


def test_a_timeout_of_a_blocked_batch(make_server, both_paths) -> None:
    """A full queue: over gRPC the batch is sent and stays in flight through a timed-out
    flush until a reader makes room; a server of this process stores it in the call, which
    times out keeping what fitted (as `Client.insert_steps`)."""
    server = make_server([reverb.Table.queue("q", 5)])
    client = reverb.Client(f"localhost:{server.port}")
    writer = client.batch_writer()
    writer.insert_steps({"v": np.arange(4)}, {"q": 1.0}, timeout=T)
    if both_paths == "grpc":
        writer.insert_steps({"v": np.arange(10, 13)}, {"q": 1.0}, timeout=0.3)
        with pytest.raises(reverb.errors.DeadlineExceededError, match="stay in flight"):
            writer.flush(timeout_ms=300)
        assert writer.num_unconfirmed_items == 3
        expected = [0, 1, 2, 3, 10, 11, 12]
    else:
        with pytest.raises(reverb.errors.DeadlineExceededError, match="others are not stored"):
            writer.insert_steps({"v": np.arange(10, 13)}, {"q": 1.0}, timeout=0.3)
        expected = [0, 1, 2, 3, 10]
    assert _flushed_while_read(client, writer, "q", len(expected)) == expected
    writer.insert_steps({"v": np.arange(20, 22)}, {"q": 1.0}, timeout=T)
    writer.flush(timeout_ms=int(T * 1000))
    assert [int(d[0]) for _, d in _queue_values(client, "q", 2)] == [20, 21]
    writer.close()


def test_batches_a_stopped_server_did_not_confirm_go_to_the_restarted_one(
    make_server, both_paths
) -> None:
    """A batch blocked in a full queue when its server stops stays in flight through a
    timed-out flush (no server), and goes to the server restarted on the address."""
    if both_paths != "grpc":
        pytest.skip("a server of this process stores each batch in the call")
    first = make_server([reverb.Table.queue("q", 2)])
    port = first.port
    client = reverb.Client(f"localhost:{port}")
    with client.batch_writer() as writer:
        writer.insert_steps({"v": np.arange(2)}, {"q": 1.0}, timeout=T)
        writer.insert_steps({"v": np.arange(10, 13)}, {"q": 1.0}, timeout=T)
        with pytest.raises(reverb.errors.DeadlineExceededError):
            writer.flush(timeout_ms=300)
        first.stop()
        with pytest.raises(reverb.errors.ReverbError):
            writer.flush(timeout_ms=1000)
        assert writer.num_unconfirmed_items == 3
        second = make_server([reverb.Table.queue("q", 100)], port=port)
        wait_for(lambda: answers(client), T, "the restarted server to answer")
        writer.insert_steps({"v": np.arange(20, 22)}, {"q": 1.0}, timeout=T)
    assert second.localhost_client().server_info(timeout=T)["q"].current_size == 5
    assert [int(d[0]) for _, d in _queue_values(client, "q", 5)] == [10, 11, 12, 20, 21]


def test_bad_batches_are_refused_before_anything_is_sent(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    signature = {"obs": tf.TensorSpec([2], tf.float32)}
    server = make_server([reverb.Table.queue("sig", 100, signature=signature)])
    client = reverb.Client(f"localhost:{server.port}")
    with pytest.raises(ValueError, match="max_in_flight_items"):
        client.batch_writer(max_in_flight_items=0)
    writer = client.batch_writer()
    ok = {"obs": np.zeros((4, 2), np.float32)}
    with pytest.raises(ValueError, match="Unable to find signatures for table 'nope'"):
        writer.insert_steps(ok, {"nope": 1.0})
    with pytest.raises(ValueError, match="CreateItem in table 'sig' because"):
        writer.insert_steps({"obs": np.zeros((4, 3), np.float32)}, {"sig": 1.0})
    with pytest.raises(ValueError, match="needs one priority or 4"):
        writer.insert_steps(ok, {"sig": [1.0, 2.0]})
    writer.insert_steps({"obs": np.zeros((0, 2), np.float32)}, {"sig": 1.0})
    writer.flush()
    assert client.server_info(timeout=T)["sig"].current_size == 0
    writer.insert_steps(ok, {"sig": 1.0}, timeout=T)
    writer.close()
    with pytest.raises(RuntimeError, match="closed"):
        writer.insert_steps(ok, {"sig": 1.0})


def test_strings_follow_the_batches_in_flight(make_server) -> None:
    server = make_server([reverb.Table.queue("q", 100)])
    client = reverb.Client(f"localhost:{server.port}")
    with client.batch_writer() as writer:
        writer.insert_steps({"i": np.arange(3), "s": np.zeros(3)}, {"q": 1.0}, timeout=T)
        words = np.array([b"a", b"bb"], dtype=object)
        writer.insert_steps({"i": np.arange(3, 5), "s": words}, {"q": 1.0}, timeout=T)
        writer.insert_steps({"i": np.arange(5, 6), "s": np.zeros(1)}, {"q": 1.0}, timeout=T)
    got = _queue_values(client, "q", 6)
    assert [int(d[0]) for _, d in got] == list(range(6))
    assert [d[1] for _, d in got[3:5]] == [b"a", b"bb"]
