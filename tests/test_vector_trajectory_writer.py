"""VectorTrajectoryWriter: N parallel episodes through one writer, end to end."""

from __future__ import annotations

import numpy as np
import pytest

import reverb
from reverb import rate_limiters, selectors

tf = pytest.importorskip("tensorflow")

# Every test runs twice: inserting into this process's server directly, and over gRPC.
pytestmark = pytest.mark.usefixtures("both_paths")

T = 10.0
TMS = 10_000


def _fifo(name: str, signature=None) -> reverb.Table:
    """Items come out once each, in insertion order."""
    return reverb.Table(
        name,
        selectors.Fifo(),
        selectors.Fifo(),
        10_000,
        rate_limiters.MinSize(1),
        max_times_sampled=1,
        signature=signature,
    )


@pytest.fixture
def client(make_server) -> reverb.Client:
    spec = {"obs": tf.TensorSpec([], tf.float32), "t": tf.TensorSpec([], tf.int32)}
    server = make_server([_fifo("a"), _fifo("b"), _fifo("sig", signature=spec)])
    return server.localhost_client()


def _drain(client: reverb.Client, table: str) -> list:
    n = client.server_info(timeout=T)[table].current_size
    return list(client.sample(table, n, emit_timesteps=False, timeout=T)) if n else []


def _step(t: int, n: int) -> dict:
    """Step t of every env: obs [env * 100 + t], t."""
    return {"obs": np.arange(n, dtype=np.float32) * 100 + t, "t": np.full(n, t, np.int32)}


def test_items_come_from_each_envs_own_episode(client) -> None:
    n = 3
    with client.vector_trajectory_writer(n, num_keep_alive_refs=2) as writer:
        assert writer.num_envs == n
        for t in range(4):
            writer.append(_step(t, n))
            ready = writer.episode_steps >= 2
            writer.create_item(
                "a",
                np.arange(1, 1 + ready.sum(), dtype=np.float64),
                {"obs": writer.history["obs"][-2:], "t": writer.history["t"][-1]},
                envs=ready,
            )
            if t == 1:
                writer.end_episode(envs=[1])
        np.testing.assert_array_equal(writer.episode_steps, [4, 2, 4])
    got = [(s.info.priority, s.data[0].tolist(), int(s.data[1])) for s in _drain(client, "a")]
    assert got == [
        (1.0, [0, 1], 1),
        (2.0, [100, 101], 1),
        (3.0, [200, 201], 1),
        (1.0, [1, 2], 2),  # env 1 started a new episode at t=2: one step only
        (2.0, [201, 202], 2),
        (1.0, [2, 3], 3),
        (2.0, [102, 103], 3),
        (3.0, [202, 203], 3),
    ]


def test_history_indexing_envs_and_two_tables_sharing_chunks(client) -> None:
    n = 4
    with client.vector_trajectory_writer(n, num_keep_alive_refs=3) as writer:
        for t in range(3):
            writer.append(_step(t, n))
        obs = writer.history["obs"]
        writer.create_item("a", 1.0, obs[::2], envs=np.array([0, 3]))
        writer.create_item("b", 1.0, obs[[2, 0]], envs=[True, False, True, False])
        writer.create_item("b", 1.0, obs[-1:0:-1], envs=1)
        # No env selected (e.g. none finished): nothing happens.
        writer.create_item("a", 1.0, obs[-1], envs=[])
        writer.end_episode(envs=[])
        np.testing.assert_array_equal(writer.episode_steps, [3, 3, 3, 3])
    a = [s.data[0].tolist() for s in _drain(client, "a")]
    b = [s.data[0].tolist() for s in _drain(client, "b")]
    assert a == [[0, 2], [300, 302]]
    assert b == [[2, 0], [202, 200], [102, 101]]
    info = client.server_info(timeout=T)
    assert info["a"].current_size == 0 and info["b"].current_size == 0


def test_bad_input_names_the_problem_and_queues_nothing(client) -> None:
    n = 2
    writer = client.vector_trajectory_writer(n, num_keep_alive_refs=2)
    writer.append(_step(0, n))
    with pytest.raises(ValueError, match="leading dimension of num_envs"):
        writer.append({"obs": np.zeros(3, np.float32), "t": np.zeros(2, np.int32)})
    with pytest.raises(ValueError, match=r"column \('t',\).*int64.*int32"):
        writer.append({"obs": np.zeros(2, np.float32), "t": np.zeros(2, np.int64)})
    with pytest.raises(ValueError, match="partial steps"):
        writer.append(_step(1, n), partial_step=True)
    writer.end_episode(envs=[0])
    writer.append(_step(1, n))
    # Env 0 has one step in its new episode: [-2:] selects only that one for it, [-2] none.
    with pytest.raises(ValueError, match="env 0: history index -2 out of range"):
        writer.create_item("a", 1.0, writer.history["obs"][-2])
    with pytest.raises(ValueError, match="2 priorities for 1 envs"):
        writer.create_item("a", [1.0, 2.0], writer.history["obs"][-1], envs=[1])
    with pytest.raises(ValueError, match="out of range for num_envs 2"):
        writer.create_item("a", 1.0, writer.history["obs"][-1], envs=[2])
    with pytest.raises(ValueError, match="boolean env mask"):
        writer.create_item("a", 1.0, writer.history["obs"][-1], envs=[True])
    with pytest.raises(ValueError, match="inconsistent with the table signature"):
        writer.create_item(
            "sig", 1.0, {"obs": writer.history["obs"][-1], "t": writer.history["obs"][-1]}
        )
    with pytest.raises(reverb.errors.NotFoundError, match="nope"):
        writer.create_item("nope", 1.0, writer.history["obs"][-1])
    writer.flush(timeout_ms=TMS)
    sizes = {name: info.current_size for name, info in client.server_info(timeout=T).items()}
    assert sizes == {"a": 0, "b": 0, "sig": 0}
    # After all that, the writer still works.
    writer.create_item("sig", 1.0, {"obs": writer.history["obs"][-1], "t": writer.history["t"][-1]})
    writer.flush(timeout_ms=TMS)
    got = [(float(s.data[0]), int(s.data[1])) for s in _drain(client, "sig")]
    assert got == [(1.0, 1), (101.0, 1)]
    writer.close()


def test_expired_history_is_rejected(client) -> None:
    writer = client.vector_trajectory_writer(2, num_keep_alive_refs=2)
    for t in range(3):
        writer.append(_step(t, 2))
    with pytest.raises(ValueError, match="has expired"):
        writer.create_item("a", 1.0, writer.history["obs"][:])
    writer.configure(("obs",), num_keep_alive_refs=3, max_chunk_length=None)
    writer.append(_step(3, 2))
    writer.append(_step(4, 2))
    writer.create_item("a", 1.0, writer.history["obs"][-3:])
    writer.flush(timeout_ms=TMS)
    assert [s.data[0].tolist() for s in _drain(client, "a")] == [[2, 3, 4], [102, 103, 104]]


def test_many_envs_many_items_all_arrive(client) -> None:
    n, steps = 64, 50
    with client.vector_trajectory_writer(n, num_keep_alive_refs=2) as writer:
        for t in range(steps):
            writer.append(_step(t, n))
            if t >= 1:
                writer.create_item("a", 1.0, writer.history["t"][-2:])
            if t % 7 == 6:
                writer.end_episode(envs=np.arange(t % n, n, 5))
        writer.end_episode(timeout_ms=TMS)
        assert writer.num_unconfirmed_items == 0
    got = [s.data[0].tolist() for s in _drain(client, "a")]
    # Every env makes an item at every step after its first; right after its episode ended,
    # [-2:] holds the one step of the new episode.
    ends = sum(len(range(t % n, n, 5)) for t in range(steps - 1) if t % 7 == 6)
    assert len(got) == (steps - 1) * n
    assert sum(len(ts) == 1 for ts in got) == ends
    assert all(len(ts) == 1 or ts[1] == ts[0] + 1 for ts in got)


def test_history_numpy_reads_each_envs_own_episode(client) -> None:
    n = 3
    with client.vector_trajectory_writer(n, num_keep_alive_refs=3) as writer:
        for t in range(3):
            writer.append(_step(t, n))
        writer.end_episode(envs=[1])  # env 1 starts over at t = 3
        for t in range(3, 5):
            writer.append(_step(t, n))
        obs = writer.history["obs"]
        last_two = obs[-2:].numpy()
        assert [a.tolist() for a in last_two] == [[3, 4], [103, 104], [203, 204]]
        np.testing.assert_array_equal(obs[0].numpy(env=1), np.float32(103))
        assert [a.tolist() for a in obs[[-2]].numpy()] == [[3], [103], [203]]
        assert obs[-1].numpy(env=2).shape == () and obs[-2:].numpy(env=0).dtype == np.float32
        assert [len(a) for a in obs[-3:].numpy()] == [3, 2, 3], "each env's own length"
        with pytest.raises(IndexError, match="env 1's episode of 2 steps"):
            obs[-3].numpy()
        with pytest.raises(RuntimeError, match="expired"):
            obs[0].numpy(env=0)  # step 0: older than num_keep_alive_refs
        with pytest.raises(ValueError, match="out of range"):
            obs[-1].numpy(env=3)
        with pytest.raises(ValueError, match="step cannot be zero"):
            obs[::0].numpy()
