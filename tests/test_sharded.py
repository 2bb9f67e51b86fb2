"""`ShardedClient` and samplers over several servers: the global sampling distribution,
placement of writes, routed priority updates, merged server info, and shards that die and
come back under running samplers and writers."""

from __future__ import annotations

import math
import pickle
import threading
import time
from collections import Counter
from typing import Dict, List

import numpy as np
import pytest
from _standalone import start, stop
from _wait import wait_for
from conftest import CALL_TIMEOUT

import reverb
from reverb import rate_limiters, selectors
from reverb.sharded_client import key_shard


def _table(name: str = "t", sampler=None, max_size: int = 10_000) -> reverb.Table:
    return reverb.Table(
        name,
        sampler or selectors.Uniform(),
        selectors.Fifo(),
        max_size,
        rate_limiters.MinSize(1),
    )


def _shards(make_server, n: int, **table_args) -> reverb.ShardedClient:
    servers = [make_server([_table(**table_args)]) for _ in range(n)]
    return reverb.ShardedClient([f"localhost:{s.port}" for s in servers])


def _close_to(frequency: float, p: float, n: int) -> bool:
    """Whether an observed frequency over n draws is within 5 standard deviations of p."""
    return abs(frequency - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_uniform_sampling_covers_the_union_of_shards_of_different_sizes(make_server) -> None:
    client = _shards(make_server, 3)
    sizes = [10, 30, 60]
    for shard, size in enumerate(sizes):
        for i in range(size):
            client.shards[shard].insert([np.int32(shard), np.int32(i)], {"t": 1.0})
    n = 6000
    counts: Counter = Counter()
    for sample in client.sample("t", n, emit_timesteps=False, timeout=CALL_TIMEOUT):
        counts[int(sample.data[0][0])] += 1
        assert sample.info.probability == pytest.approx(1 / 100, rel=1e-9)
        assert sample.info.table_size == 100
    for shard, size in enumerate(sizes):
        assert _close_to(counts[shard] / n, size / 100, n), counts
    # The prefetching sampler draws the same way.
    counts.clear()
    with reverb.TrajectoryIterator(client.server_addresses, "t", batch_size=100) as it:
        for _ in range(n // 100):
            batch = next(it)
            counts.update(batch.data[0][:, 0].tolist())
            np.testing.assert_allclose(batch.info.probability, 1 / 100, rtol=1e-9)
            assert set(batch.info.table_size.tolist()) == {100}
        assert it.missing_shards == []
    for shard, size in enumerate(sizes):
        assert _close_to(counts[shard] / n, size / 100, n), counts


def test_prioritized_sampling_follows_the_global_priorities(make_server) -> None:
    exponent = 0.7
    client = _shards(make_server, 3, sampler=selectors.Prioritized(exponent))
    priorities: Dict[int, float] = {}
    shard_of: Dict[int, int] = {}
    with client.trajectory_writer(1) as writer:
        for episode in range(6):
            shard = writer.shard
            for step in range(2 + shard * 3):  # episodes of 2, 5 or 8 items by shard
                value = episode * 100 + step
                priority = float(1 + (value * 7919) % 13) * (shard + 1)
                writer.append({"v": np.int64(value), "s": np.int8(shard)})
                writer.create_item(
                    "t", priority, {"v": writer.history["v"][-1], "s": writer.history["s"][-1]}
                )
                priorities[value] = priority
                shard_of[value] = shard
            writer.end_episode(timeout_ms=int(CALL_TIMEOUT * 1000))
    assert set(shard_of.values()) == {0, 1, 2}  # episodes went to every shard in turn
    weights = {v: p**exponent for v, p in priorities.items()}
    total = sum(weights.values())
    shares = {s: sum(w for v, w in weights.items() if shard_of[v] == s) / total for s in range(3)}
    n = 8000
    per_shard: Counter = Counter()
    for sample in client.sample("t", n, emit_timesteps=False, timeout=CALL_TIMEOUT):
        shard, value = int(sample.data[0]), int(sample.data[1])  # (flattened: "s", "v")
        per_shard[shard] += 1
        assert sample.info.probability == pytest.approx(weights[value] / total, rel=1e-9)
        assert sample.info.table_size == len(priorities)
        assert key_shard(int(sample.info.key)) == shard == shard_of[value]
    iterated: Counter = Counter()
    with reverb.TrajectoryIterator(client.server_addresses, "t", batch_size=200) as it:
        for _ in range(n // 200):
            batch = next(it)
            iterated.update(batch.data[0].tolist())
            expected = [weights[v] / total for v in batch.data[1].tolist()]
            np.testing.assert_allclose(batch.info.probability, expected, rtol=1e-9)
    for counts in (per_shard, iterated):
        for shard, share in shares.items():
            assert _close_to(counts[shard] / n, share, n), (counts, shares)


def _priorities(client: reverb.Client, n: int = 200) -> Dict[int, float]:
    """Key -> priority of the items a shard's samples show."""
    return {
        int(s.info.key): s.info.priority
        for s in client.sample("t", n, emit_timesteps=False, timeout=CALL_TIMEOUT)
    }


def test_priority_updates_go_only_to_the_shard_that_holds_the_key(make_server) -> None:
    servers = [make_server([_table()]) for _ in range(3)]
    client = reverb.ShardedClient([f"localhost:{s.port}" for s in servers])
    for i in range(9):
        client.insert(np.int64(i), {"t": 1.0}, timeout=CALL_TIMEOUT)
    keys = {shard: sorted(_priorities(c)) for shard, c in enumerate(client.shards)}
    assert [len(k) for k in keys.values()] == [3, 3, 3], keys  # round robin
    for shard, shard_keys in keys.items():
        assert {key_shard(k) for k in shard_keys} == {shard}
    # With shard 2 down, updates of keys held by shards 0 and 1 reach only them: they
    # succeed at once and change exactly those items.
    servers[2].stop()
    client.mutate_priorities(
        "t", updates={keys[0][0]: 5.0, keys[1][1]: 7.0}, deletes=[keys[1][2]], timeout=2
    )
    assert _priorities(client.shards[0]) == {keys[0][0]: 5.0, keys[0][1]: 1.0, keys[0][2]: 1.0}
    assert _priorities(client.shards[1]) == {keys[1][0]: 1.0, keys[1][1]: 7.0}
    # A key of unknown origin goes to every shard, so the dead one fails the call.
    with pytest.raises((reverb.errors.UnavailableError, reverb.DeadlineExceededError)):
        client.mutate_priorities("t", updates={12345: 1.0}, timeout=1)


def test_keys_of_unknown_origin_reach_the_shard_that_holds_them(make_server) -> None:
    client = _shards(make_server, 2)
    plain = reverb.Client(client.server_addresses[1])
    plain.insert(np.int64(1), {"t": 1.0}, timeout=CALL_TIMEOUT)
    (key,) = _priorities(plain)
    assert key_shard(key) is None  # a plain client's keys never look like a shard's
    client.mutate_priorities("t", updates={key: 3.0}, timeout=CALL_TIMEOUT)
    assert _priorities(plain) == {key: 3.0}


def test_inserts_are_placed_round_robin_by_key_or_by_placement(make_server) -> None:
    client = _shards(make_server, 3)

    def sizes() -> List[int]:
        return [info["t"].current_size for info in client.shard_info(timeout=CALL_TIMEOUT)]

    for i in range(9):
        client.insert(np.int64(i), {"t": 1.0}, timeout=CALL_TIMEOUT)
    assert sizes() == [3, 3, 3]
    for _ in range(4):
        client.insert(np.int64(0), {"t": 1.0}, shard_key="episode-7", timeout=CALL_TIMEOUT)
    client.insert(np.int64(0), {"t": 1.0}, shard_key=5, timeout=CALL_TIMEOUT)
    after = sizes()
    assert sorted(np.subtract(after, [3, 3, 3]).tolist()) in ([0, 1, 4], [0, 0, 5])
    assert after[5 % 3] >= 4
    placed = reverb.ShardedClient(client.server_addresses, placement=lambda data, p: int(data) % 2)
    for value in (0, 2, 4):
        placed.insert(np.int64(value), {"t": 1.0}, timeout=CALL_TIMEOUT)
    assert sizes()[0] == after[0] + 3
    wrong = reverb.ShardedClient(client.server_addresses, placement=lambda data, p: 7)
    with pytest.raises(ValueError, match="placement chose shard 7; there are 3 shards"):
        wrong.insert(np.int64(0), {"t": 1.0})


def test_batches_go_to_one_shard_each_and_batch_writers_spread(make_server) -> None:
    client = _shards(make_server, 3)

    def sizes() -> List[int]:
        return [info["t"].current_size for info in client.shard_info(timeout=CALL_TIMEOUT)]

    for _ in range(3):
        client.insert_steps(np.arange(4, dtype=np.int64), {"t": 1.0}, timeout=CALL_TIMEOUT)
    assert sizes() == [4, 4, 4]
    client.insert_steps(np.arange(5, dtype=np.int64), {"t": 1.0}, shard_key=4)
    assert sizes() == [4, 9, 4]
    for _ in range(3):
        with client.batch_writer() as writer:
            writer.insert_steps(np.arange(2, dtype=np.int64), {"t": 1.0}, timeout=CALL_TIMEOUT)
    assert sorted(np.subtract(sizes(), [4, 9, 4]).tolist()) == [2, 2, 2]
    # Keys written through the sharded client name their shard.
    for shard, c in enumerate(client.shards):
        keys = [int(s[0].info.key) for s in c.sample("t", 20, timeout=CALL_TIMEOUT)]
        assert {key_shard(k) for k in keys} == {shard}


def test_server_info_sums_the_shards_and_shard_info_reports_a_dead_one(make_server) -> None:
    servers = [make_server([_table()]) for _ in range(3)]
    client = reverb.ShardedClient([f"localhost:{s.port}" for s in servers])
    for i in range(7):
        client.insert(np.int64(i), {"t": 1.0}, timeout=CALL_TIMEOUT)
    info = client.server_info(timeout=CALL_TIMEOUT)["t"]
    assert (info.current_size, info.max_size) == (7, 30_000)
    servers[1].stop()
    per_shard = client.shard_info(timeout=1)
    assert isinstance(per_shard[1], (reverb.errors.UnavailableError, reverb.DeadlineExceededError))
    alive = sum(p["t"].current_size for i, p in enumerate(per_shard) if i != 1)
    assert alive in (4, 5)  # 7 items round robin from a random first shard
    assert client.server_info(timeout=1)["t"].current_size == alive
    # Samplers skip the dead shard.
    samples = list(client.sample("t", 50, emit_timesteps=False, timeout=CALL_TIMEOUT))
    assert {key_shard(int(s.info.key)) for s in samples} == {0, 2}
    assert {s.info.table_size for s in samples} == {alive}


def test_checkpoint_reset_and_pickling(make_server, tmp_path) -> None:
    servers = [
        reverb.Server(
            [_table()],
            checkpointer=reverb.checkpointers.DefaultCheckpointer(str(tmp_path / str(i))),
        )
        for i in range(2)
    ]
    try:
        client = reverb.ShardedClient([f"localhost:{s.port}" for s in servers])
        client.insert(np.int64(1), {"t": 1.0}, shard_key=0, timeout=CALL_TIMEOUT)
        paths = client.checkpoint(timeout=CALL_TIMEOUT)
        assert len(paths) == 2
        assert [p.startswith(str(tmp_path / str(i))) for i, p in enumerate(paths)] == [True] * 2
        copy = pickle.loads(pickle.dumps(client))
        assert copy.server_addresses == client.server_addresses
        copy.insert(np.int64(2), {"t": 1.0}, shard_key=1, timeout=CALL_TIMEOUT)
        keys = [int(s.info.key) for s in copy.sample("t", 20, emit_timesteps=False)]
        assert {key_shard(k) for k in keys} == {0, 1}
        client.reset("t", timeout=CALL_TIMEOUT)
        assert client.server_info(timeout=CALL_TIMEOUT)["t"].current_size == 0
    finally:
        for server in servers:
            server.stop()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="got a string"):
        reverb.ShardedClient("localhost:1")
    with pytest.raises(ValueError, match="at least one server"):
        reverb.ShardedClient([])
    with pytest.raises(ValueError, match="duplicates"):
        reverb.ShardedClient(["localhost:1", "localhost:1"])
    with pytest.raises(ValueError, match="at most 64 shards"):
        reverb.ShardedClient([f"localhost:{i}" for i in range(1, 66)])
    with pytest.raises(ValueError, match="Invalid server address"):
        reverb.ShardedClient(["localhost:1", ""])
    with pytest.raises(TypeError, match="shard_key"):
        reverb.ShardedClient(["localhost:1"]).insert(np.int64(0), {"t": 1.0}, shard_key=1.5)


def test_sampling_a_table_no_shard_has_fails_as_one_server_does(make_server) -> None:
    client = _shards(make_server, 2)
    with pytest.raises(reverb.errors.ReverbError, match="nope"):
        list(client.sample("nope", 1, timeout=CALL_TIMEOUT))
    with pytest.raises(reverb.errors.ReverbError, match="nope"):
        with reverb.TrajectoryIterator(client.server_addresses, "nope") as it:
            next(it)


def test_empty_shards_wait_until_the_timeout(make_server) -> None:
    client = _shards(make_server, 2)
    begin = time.monotonic()
    with pytest.raises(reverb.DeadlineExceededError):
        list(client.sample("t", 1, timeout=0.5))
    assert time.monotonic() - begin < 5
    with reverb.TrajectoryIterator(client.server_addresses, "t", rate_limiter_timeout_ms=300) as it:
        assert list(it) == []


def test_a_shard_killed_and_restarted_under_running_samplers_and_writers(tmp_path) -> None:
    """Shard 1 of 3 (server processes) is killed (SIGKILL) while a writer spreads episodes
    over the shards and a sampler reads them: the sampler goes on drawing from the other two
    and reports the missing shard; once a new server runs on its port the writer's episodes
    reach it again and the sampler draws from it again. Nothing fails."""
    table = {
        "name": "t",
        "sampler": "uniform",
        "remover": "fifo",
        "max_size": 100_000,
        "rate_limiter": {"min_size": 1},
    }
    procs = [start({"port": 0, "tables": [table]}, tmp_path) for _ in range(3)]
    addresses = [f"localhost:{port}" for _, port, _ in procs]
    client = reverb.ShardedClient(addresses)
    stop_event = threading.Event()
    failures: list = []
    written: list = []  # (shard, episode) of episodes confirmed
    seen: list = []  # (shard, episode) of samples

    def write() -> None:
        try:
            with client.trajectory_writer(1) as writer:
                episode = 0
                while not stop_event.is_set():
                    shard = writer.shard
                    for _ in range(3):
                        writer.append({"shard": np.int32(shard), "episode": np.int32(episode)})
                        writer.create_item(
                            "t",
                            1.0,
                            {k: writer.history[k][-1] for k in ("shard", "episode")},
                        )
                    writer.end_episode(timeout_ms=60_000)
                    written.append((shard, episode))
                    episode += 1
                    time.sleep(0.005)  # a time: paces the writer, as an environment would
        except Exception as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    missing: list = []

    def sample() -> None:
        try:
            with reverb.TrajectoryIterator(addresses, "t", batch_size=4) as samples:
                for batch in samples:
                    episodes = batch.data[0].tolist()
                    seen.extend(zip(batch.data[1].tolist(), episodes))
                    missing.append(tuple(samples.missing_shards))
                    if stop_event.is_set():
                        return
        except Exception as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    threads = [threading.Thread(target=write), threading.Thread(target=sample)]
    restarted = None
    try:
        for t in threads:
            t.start()
        wait_for(
            lambda: {s for s, _ in seen} == {0, 1, 2},
            60,
            "samples of every shard",
            failures=failures,
        )
        victim, port, _ = procs[1]
        victim.kill()
        victim.communicate(timeout=CALL_TIMEOUT)
        killed_at = len(seen)
        wait_for(
            lambda: (addresses[1],) in missing,
            60,
            "the sampler to report the dead shard",
            failures=failures,
        )
        wait_for(
            lambda: len(seen) > killed_at + 200,
            60,
            "samples from the other shards",
            failures=failures,
        )
        last_before = max((e for s, e in written if s == 1), default=-1)
        restarted = start({"port": port, "tables": [table]}, tmp_path)
        wait_for(
            lambda: any(s == 1 and e > last_before for s, e in written),
            60,
            "episodes on the new shard",
            failures=failures,
        )
        wait_for(
            lambda: any(s == 1 and e > last_before for s, e in seen[killed_at:]),
            60,
            "samples from the new shard",
            failures=failures,
        )
        wait_for(lambda: missing[-1] == (), 60, "the shard to be reported back", failures=failures)
    finally:
        stop_event.set()
        for t in threads:
            t.join(60)
        for proc, _, lines in procs:
            if proc.returncode is None:
                stop(proc, lines)
        if restarted is not None:
            stop(restarted[0], restarted[2])
    assert not failures, failures
    assert not any(t.is_alive() for t in threads)


def test_datasets_read_a_list_of_addresses(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    client = _shards(make_server, 2)
    for shard, size in enumerate([10, 30]):
        with client.shards[shard].trajectory_writer(2) as writer:
            for i in range(size):
                writer.append({"shard": np.int32(shard), "step": np.float32(i)})
                writer.append({"shard": np.int32(shard), "step": np.float32(i + 0.5)})
                writer.create_item("t", 1.0, {k: writer.history[k][-2:] for k in ("shard", "step")})
                writer.end_episode()
    dtypes = {"shard": tf.int32, "step": tf.float32}
    dataset = reverb.TrajectoryDataset(
        client.server_addresses,
        "t",
        dtypes,
        {"shard": tf.TensorShape([2]), "step": tf.TensorShape([2])},
        max_in_flight_samples_per_worker=10,
    )
    counts: Counter = Counter()
    n = 2000
    for batch in dataset.batch(100).take(n // 100):
        counts.update(batch.data["shard"].numpy()[:, 0].tolist())
        np.testing.assert_allclose(batch.info.probability.numpy(), 1 / 40, rtol=1e-9)
        assert set(batch.info.table_size.numpy().tolist()) == {40}
    assert _close_to(counts[1] / n, 0.75, n), counts
    steps = reverb.TimestepDataset(
        tuple(client.server_addresses),
        "t",
        dtypes,
        {"shard": tf.TensorShape([]), "step": tf.TensorShape([])},
        max_in_flight_samples_per_worker=4,
        max_samples=50,
    )
    values = [(int(s.data["shard"]), float(s.data["step"])) for s in steps]
    assert len(values) == 100  # two steps per item
    assert all(step % 1 == (0.0 if i % 2 == 0 else 0.5) for i, (_, step) in enumerate(values))
    assert {shard for shard, _ in values} == {0, 1}


def test_reference_servers_as_shards() -> None:
    """dm-reverb servers (which do not report their sampler's total weight) serve as shards:
    uniform tables are drawn by size."""
    import contextlib

    import _reference as reference

    if not reference.PYTHON:
        pytest.skip("REVERB_REFERENCE_PYTHON is not set")
    tables = """[reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                              reverb.rate_limiters.MinSize(1))]"""
    with contextlib.ExitStack() as servers:
        ports = [servers.enter_context(reference.server(tables)) for _ in range(2)]
        addresses = [f"localhost:{port}" for port in ports]
        client = reverb.ShardedClient(addresses)
        for i in range(40):
            client.insert(np.int64(i), {"t": 1.0}, shard_key=int(i >= 10), timeout=CALL_TIMEOUT)
        assert [i["t"].current_size for i in client.shard_info(timeout=CALL_TIMEOUT)] == [10, 30]
        n = 2000
        big = 0
        for sample in client.sample("t", n, emit_timesteps=False, timeout=CALL_TIMEOUT):
            big += int(sample.data[0][0]) >= 10
            assert sample.info.probability == pytest.approx(1 / 40, rel=1e-9)
            assert sample.info.table_size == 40
        assert _close_to(big / n, 0.75, n), big
        with reverb.TrajectoryIterator(addresses, "t", batch_size=100, max_samples=n) as it:
            values = np.concatenate([b.data[0].ravel() for b in it])
        assert len(values) == n
        assert _close_to(float(np.mean(values >= 10)), 0.75, n)
        # Their keys are of unknown origin: updates go to both, and reach the right item.
        key = next(iter(_priorities(client.shards[0], 20)))
        client.mutate_priorities("t", updates={key: 4.0}, timeout=CALL_TIMEOUT)
        assert _priorities(client.shards[0], 200)[key] == 4.0


def test_rate_limited_shards_do_not_deadlock_one_writer_and_one_sampler(make_server) -> None:
    """Each shard's SampleToInsertRatio limiter blocks inserts until its items are sampled.
    One writer (blocked on the shard of its episode) and one sharded sampler (which may have
    drawn another shard, waiting for inserts) must not wait for each other: the sampler
    draws again from shards with samples ready."""
    # (At most about 3 inserts ahead of the samples, and 1 sample ahead of the inserts.)
    limiter = rate_limiters.SampleToInsertRatio(1.0, 1, 2.0)
    servers = [
        make_server([reverb.Table("t", selectors.Uniform(), selectors.Fifo(), 10_000, limiter)])
        for _ in range(3)
    ]
    client = reverb.ShardedClient([f"localhost:{s.port}" for s in servers])
    done = threading.Event()
    failures: list = []

    def sample() -> None:
        try:
            with reverb.TrajectoryIterator(
                client.server_addresses,
                "t",
                batch_size=4,
                max_in_flight_samples_per_worker=2,
                num_workers_per_iterator=1,
                rate_limiter_timeout_ms=5000,
            ) as it:
                for _ in it:
                    if done.is_set():
                        return
        except Exception as e:  # noqa: BLE001 - reported by the test
            failures.append(e)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with client.trajectory_writer(1) as writer:
            for episode in range(9):
                for step in range(30):
                    writer.append({"x": np.int64(episode * 100 + step)})
                    writer.create_item("t", 1.0, {"x": writer.history["x"][-1]})
                writer.end_episode(timeout_ms=20_000)
    finally:
        done.set()
        sampler.join(30)
    assert not failures, failures
    sizes = [i["t"].current_size for i in client.shard_info(timeout=CALL_TIMEOUT)]
    assert sizes == [90, 90, 90]


def test_max_samples_bounds_what_each_shard_gives_from_queues(make_server) -> None:
    """With max_samples on queues, each shard's sampler requests at most that many."""
    servers = [make_server([reverb.Table.queue("q", 1000)]) for _ in range(2)]
    client = reverb.ShardedClient([f"localhost:{s.port}" for s in servers])
    for shard in range(2):
        for i in range(50):
            client.shards[shard].insert(np.int64(shard * 100 + i), {"q": 1.0})
    with reverb.TrajectoryIterator(client.server_addresses, "q", max_samples=5) as it:
        assert len(list(it)) == 5
    # The 5 items that came out left their queues (a fact) ...
    assert client.server_info(timeout=CALL_TIMEOUT)["q"].current_size <= 95
    # ... and no sampler takes more than max_samples from its shard: a negative, given time
    # to fail.
    time.sleep(0.3)
    assert client.server_info(timeout=CALL_TIMEOUT)["q"].current_size >= 90


def test_queues_are_drained_whole_by_a_sharded_iterator(make_server) -> None:
    """Items a shard's sampler holds still count for the draw (its server no longer counts
    them): every item of two queues comes out before the stream ends on its timeout."""
    servers = [make_server([reverb.Table.queue("q", 1000)]) for _ in range(2)]
    client = reverb.ShardedClient([f"localhost:{s.port}" for s in servers])
    for shard in range(2):
        for i in range(10):
            client.shards[shard].insert(np.int64(shard * 100 + i), {"q": 1.0})
    begin = time.monotonic()
    with reverb.TrajectoryIterator(client.server_addresses, "q", rate_limiter_timeout_ms=500) as it:
        values = sorted(int(np.ravel(s.data[0])[0]) for s in it)
    assert values == list(range(10)) + list(range(100, 110))
    assert time.monotonic() - begin < 10


def test_every_shard_gone_is_an_error_not_the_end_of_the_stream(make_server, monkeypatch):
    monkeypatch.setenv("REVERB_CONNECT_WAIT_SECONDS", "1")
    servers = [make_server([_table()]) for _ in range(2)]
    client = reverb.ShardedClient([f"localhost:{s.port}" for s in servers])
    for i in range(4):
        client.insert(np.int64(i), {"t": 1.0}, timeout=CALL_TIMEOUT)
    with reverb.TrajectoryIterator(client.server_addresses, "t", rate_limiter_timeout_ms=300) as it:
        next(it)
        for server in servers:
            server.stop()
        with pytest.raises(reverb.errors.UnavailableError, match="None of the 2 servers"):
            for _ in range(100_000):
                next(it)


def test_writer_configuration_follows_episodes_to_every_shard(make_server) -> None:
    client = _shards(make_server, 2)
    with client.trajectory_writer(1) as writer:
        for episode in range(4):
            for step in range(5):
                writer.append({"x": np.int64(step)})
                if episode == 0 and step == 0:
                    writer.configure(("x",), num_keep_alive_refs=5, max_chunk_length=None)
            # Needs 5 steps kept alive, on whichever shard this episode went to.
            writer.create_item("t", 1.0, {"x": writer.history["x"][:]})
            writer.end_episode(timeout_ms=int(CALL_TIMEOUT * 1000))
    sizes = [i["t"].current_size for i in client.shard_info(timeout=CALL_TIMEOUT)]
    assert sizes == [2, 2]


def test_sample_timeout_bounds_the_whole_call(make_server) -> None:
    """Four shards whose limiters block sampling (min_size 2, one item each): the call fails
    after about its timeout, not a timeout per shard."""
    servers = [
        make_server(
            [
                reverb.Table(
                    "t", selectors.Uniform(), selectors.Fifo(), 100, rate_limiters.MinSize(2)
                )
            ]
        )
        for _ in range(4)
    ]
    client = reverb.ShardedClient([f"localhost:{s.port}" for s in servers])
    for shard in client.shards:
        shard.insert(np.int64(0), {"t": 1.0}, timeout=CALL_TIMEOUT)
    begin = time.monotonic()
    with pytest.raises(reverb.DeadlineExceededError):
        list(client.sample("t", 8, timeout=1.0))
    assert time.monotonic() - begin < 2.5
