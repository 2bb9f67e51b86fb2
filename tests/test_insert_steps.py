"""Client.insert_steps: N steps as N items per table in one native call (beyond the
reference), each item what `Client.insert` of its step would make."""

from __future__ import annotations

import numpy as np
import pytest
from _metrics import waited, waiting
from _wait import answers, wait_for

import reverb
from reverb import rate_limiters, selectors

T = 10.0

# Every test runs twice: through this process's server directly, and over gRPC.
pytestmark = pytest.mark.usefixtures("both_paths")


def _queue_contents(client: reverb.Client, table: str, n: int) -> list:
    """The `n` oldest items of a queue: (priority, the leaves of its one step, in the order
    of the flattened data: a dict's keys sorted)."""
    out = []
    for sample in client.sample(table, n, timeout=T):
        (step,) = sample
        out.append((step.info.priority, step.data))
    return out


def test_each_step_becomes_one_item_in_each_table(make_server) -> None:
    server = make_server([reverb.Table.queue("a", 1000), reverb.Table.queue("b", 1000)])
    client = server.localhost_client()
    steps = {
        "obs": np.arange(30, dtype=np.float32).reshape(10, 3),
        "t": np.arange(10, dtype=np.int64),
    }
    client.insert_steps(steps, {"a": np.arange(10) + 0.5, "b": 2.0}, timeout=T)
    infos = client.server_info(timeout=T)
    assert infos["a"].current_size == 10 and infos["b"].current_size == 10
    got = _queue_contents(client, "a", 10)
    assert [p for p, _ in got] == [i + 0.5 for i in range(10)]
    for i, (_, data) in enumerate(got):
        obs, t = data
        np.testing.assert_array_equal(obs, steps["obs"][i])
        assert t == i and t.dtype == np.int64
    assert [p for p, _ in _queue_contents(client, "b", 10)] == [2.0] * 10


def test_items_match_single_inserts_and_batches_of_any_size_follow_each_other(
    make_server,
) -> None:
    """Batches growing and shrinking, with single inserts between them, on one client: every
    item holds its own step, in order."""
    server = make_server([reverb.Table.queue("q", 10_000)])
    client = server.localhost_client()
    expected = []
    at = 0
    for n in [3, 300, 1, 40, 700, 2]:
        values = np.arange(at, at + n, dtype=np.int32)
        client.insert_steps({"v": values, "w": values.astype(np.float64) * 2}, {"q": 1.0})
        client.insert({"v": np.int32(-at), "w": np.float64(-at)}, {"q": 1.0}, timeout=T)
        expected += list(range(at, at + n)) + [-at]
        at += n
    got = _queue_contents(client, "q", len(expected))
    assert [int(d[0]) for _, d in got] == expected
    assert [float(d[1]) for _, d in got] == [2.0 * v if v > 0 else float(v) for v in expected]


def test_sampled_batches_of_inserted_steps_hold_their_own_rows(make_server) -> None:
    """Items sharing one chunk per column (N rows) are gathered row by row."""
    table = reverb.Table(
        "u", selectors.Uniform(), selectors.Fifo(), 10_000, rate_limiters.MinSize(1)
    )
    server = make_server([table])
    client = server.localhost_client()
    rng = np.random.default_rng(3)
    obs = rng.random((512, 8), dtype=np.float32)
    client.insert_steps({"obs": obs, "i": np.arange(512, dtype=np.int64)}, {"u": 1.0}, timeout=T)
    address = f"localhost:{server.port}"
    with reverb.TrajectoryIterator(address, "u", batch_size=64, max_samples=640) as it:
        for batch in it:
            got_i, got_obs = batch.data  # ("i" flattens before "obs")
            assert got_obs.shape == (64, 1, 8) and got_i.shape == (64, 1)
            np.testing.assert_array_equal(got_obs[:, 0], obs[got_i[:, 0]])


def test_big_rows_go_in_several_chunks_per_column_and_each_item_keeps_its_own(
    make_server,
) -> None:
    """84x84 frames go two to a chunk, the rewards all in one: every item still holds its
    own frame and reward (in item runs: our server takes them on both paths)."""
    server = make_server([reverb.Table.queue("q", 100)])
    client = server.localhost_client()
    rng = np.random.default_rng(5)
    frames = rng.integers(0, 256, (11, 84, 84), dtype=np.uint8)
    rewards = np.arange(11, dtype=np.float32) / 2
    client.insert_steps({"frame": frames, "reward": rewards}, {"q": rewards + 1}, timeout=T)
    got = _queue_contents(client, "q", 11)
    for i, (priority, (frame, reward)) in enumerate(got):
        assert priority == rewards[i] + 1 and reward == rewards[i]
        np.testing.assert_array_equal(frame, frames[i])


def test_bad_batches_are_refused_and_store_nothing(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    signature = {"obs": tf.TensorSpec([2], tf.float32)}
    server = make_server(
        [reverb.Table.queue("sig", 100, signature=signature), reverb.Table.queue("free", 100)]
    )
    client = server.localhost_client()
    ok = {"obs": np.zeros((4, 2), np.float32)}
    with pytest.raises(ValueError, match="same leading"):
        client.insert_steps({"obs": np.zeros((4, 2), np.float32), "x": np.zeros(3)}, {"free": 1})
    with pytest.raises(ValueError, match="needs one priority or 4"):
        client.insert_steps(ok, {"free": [1.0, 2.0]})
    with pytest.raises(ValueError, match="Unable to find signatures for table 'nope'"):
        client.insert_steps(ok, {"free": 1.0, "nope": 1.0})
    with pytest.raises(ValueError, match="CreateItem in table 'sig' because"):
        client.insert_steps({"obs": np.zeros((4, 3), np.float32)}, {"free": 1.0, "sig": 1.0})
    infos = client.server_info(timeout=T)
    assert infos["free"].current_size == 0 and infos["sig"].current_size == 0
    client.insert_steps(ok, {"free": 1.0, "sig": [1, 2, 3, 4]}, timeout=T)
    infos = client.server_info(timeout=T)
    assert infos["free"].current_size == 4 and infos["sig"].current_size == 4


def test_strings_and_an_empty_batch(make_server) -> None:
    server = make_server([reverb.Table.queue("q", 100)])
    client = server.localhost_client()
    client.insert_steps({"s": np.array([], dtype=object)}, {"q": 1.0})
    words = np.array([b"a", b"bb", b"ccc"], dtype=object)
    client.insert_steps({"s": words, "i": np.arange(3)}, {"q": 1.0}, timeout=T)
    got = _queue_contents(client, "q", 3)
    assert [int(d[0]) for _, d in got] == [0, 1, 2]  # ("i" flattens before "s")
    assert [d[1] for _, d in got] == [b"a", b"bb", b"ccc"]


def test_a_full_queue_times_out_and_stores_nothing_later(make_server) -> None:
    """Items stored before the timeout stay; the rest are never stored later."""
    server = make_server([reverb.Table.queue("q", 5)], metrics_port=0)
    client = server.localhost_client()
    client.insert_steps({"v": np.arange(4)}, {"q": 1.0}, timeout=T)
    with pytest.raises(reverb.errors.DeadlineExceededError):
        client.insert_steps({"v": np.arange(10, 13)}, {"q": 1.0}, timeout=0.3)
    # Over gRPC the cancellation travels as a stream reset: wait until it reached the
    # server, whose wait for the insert has ended, before making room.
    port = server.metrics_port
    wait_for(
        lambda: waiting(port, "q", "insert") == 0 and waited(port, "q", "insert") > 0,
        T,
        "the server to drop the abandoned insert",
    )
    # The first of the three fitted; the others went with the insert.
    got = [int(d[0]) for _, d in _queue_contents(client, "q", 5)]
    assert got == [0, 1, 2, 3, 10]
    client.insert_steps({"v": np.arange(20, 22)}, {"q": 1.0}, timeout=T)
    assert [int(d[0]) for _, d in _queue_contents(client, "q", 2)] == [20, 21]
    assert client.server_info(timeout=T)["q"].current_size == 0


def test_inserts_go_on_after_the_server_restarts(make_server) -> None:
    """A client keeps its insert stream open between calls; when the server behind the
    address restarts, the next insert goes through on a new stream, stored once."""
    first = make_server([reverb.Table.queue("q", 100)])
    port = first.port
    client = reverb.Client(f"localhost:{port}")
    client.insert_steps({"v": np.arange(3)}, {"q": 1.0}, timeout=T)
    client.insert_steps({"v": np.arange(3, 5)}, {"q": 1.0}, timeout=T)
    assert client.server_info(timeout=T)["q"].current_size == 5
    first.stop()
    second = make_server([reverb.Table.queue("q", 100)], port=port)
    wait_for(lambda: answers(client), T, "the restarted server to answer")
    client.insert_steps({"v": np.arange(10, 14)}, {"q": 1.0}, timeout=T)
    assert second.localhost_client().server_info(timeout=T)["q"].current_size == 4
    assert [int(d[0]) for _, d in _queue_contents(client, "q", 4)] == [10, 11, 12, 13]


def test_a_refused_insert_is_not_sent_again(make_server, monkeypatch) -> None:
    """A call split into several requests (rows near the message limit) whose later items
    the server refuses: the items before the refusal are stored once, even on the insert
    stream an earlier call left open."""
    monkeypatch.setenv("REVERB_MAX_MESSAGE_BYTES", "40000")
    server = make_server(
        [
            reverb.Table(
                "p", selectors.Prioritized(1.0), selectors.Fifo(), 4, rate_limiters.MinSize(1)
            )
        ]
    )
    client = reverb.Client(f"localhost:{server.port}")
    client.insert_steps([np.zeros((1, 4096), np.float32)], {"p": 1.0}, timeout=T)
    before = client.server_info(timeout=T)["p"].rate_limiter_info.insert_stats.completed
    rows = np.arange(8 * 4096, dtype=np.float32).reshape(8, 4096)  # 16 KiB a row
    with pytest.raises(ValueError, match="Priority -1.0 is not valid"):
        client.insert_steps([rows], {"p": [1, 1, 1, 1, 1, 1, -1, -1]}, timeout=T)
    info = client.server_info(timeout=T)["p"]
    assert info.rate_limiter_info.insert_stats.completed - before == 6
    assert info.current_size == 4
