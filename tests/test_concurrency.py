"""Many client threads against one server: exact counters, no errors, no lost or duplicate items."""

from __future__ import annotations

import collections
import threading
import time

import numpy as np

import reverb
from reverb import rate_limiters, selectors

T = 10.0
NUM_THREADS = 32


def _run_threads(targets, join_timeout=30.0):
    """Starts one thread per target behind a barrier; returns the exceptions they raised."""
    barrier = threading.Barrier(len(targets))
    errors = []
    lock = threading.Lock()

    def wrap(target, index):
        def run():
            try:
                barrier.wait(timeout=T)
                target(index)
            except Exception as e:  # recorded and asserted by the caller
                with lock:
                    errors.append((index, e))

        return run

    threads = [threading.Thread(target=wrap(t, i)) for i, t in enumerate(targets)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + join_timeout
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads did not finish in time"
    return errors


def test_own_clients_insert_and_sample_concurrently(make_server):
    inserts_per_thread, samples_per_thread = 20, 20
    table = reverb.Table(
        "t", selectors.Uniform(), selectors.Fifo(), 100_000, rate_limiters.MinSize(1)
    )
    server = make_server([table])
    inserted = {(i, j) for i in range(NUM_THREADS) for j in range(inserts_per_thread)}
    sampled = collections.Counter()
    lock = threading.Lock()

    def worker(index):
        client = server.localhost_client()
        for j in range(inserts_per_thread):
            client.insert(np.array([index, j], dtype=np.int32), {"t": 1.0}, timeout=T)
            # The thread's own insert happened, so the table is never empty here.
            for steps in client.sample("t", 1, timeout=T):
                info = steps[0].info
                assert 1 <= info.table_size <= len(inserted)
                assert info.probability == 1.0 / info.table_size
                with lock:
                    sampled[tuple(int(x) for x in steps[0].data[0])] += 1

    start = time.monotonic()
    errors = _run_threads([worker] * NUM_THREADS)
    elapsed = time.monotonic() - start
    assert not errors, errors[:3]
    assert elapsed < 20.0

    info = table.info
    assert info.rate_limiter_info.insert_stats.completed == NUM_THREADS * inserts_per_thread
    assert info.rate_limiter_info.sample_stats.completed == NUM_THREADS * samples_per_thread
    assert info.current_size == NUM_THREADS * inserts_per_thread
    assert info.num_episodes == NUM_THREADS * inserts_per_thread
    assert sum(sampled.values()) == NUM_THREADS * samples_per_thread
    assert set(sampled) <= inserted
    assert info.num_unique_samples == len(sampled)


def test_shared_client_inserts_into_several_tables(make_server):
    per_thread = 15
    tables = [
        reverb.Table("a", selectors.Uniform(), selectors.Fifo(), 10_000, rate_limiters.MinSize(1)),
        reverb.Table(
            "b", selectors.Prioritized(1.0), selectors.Fifo(), 10_000, rate_limiters.MinSize(1)
        ),
    ]
    server = make_server(tables)
    client = server.localhost_client()  # one client shared by every thread

    def worker(index):
        for j in range(per_thread):
            client.insert(np.int64(index * 1000 + j), {"a": 1.0, "b": 1.0 + j}, timeout=T)
        assert len(list(client.sample("a", 3, timeout=T))) == 3
        assert len(list(client.sample("b", 2, timeout=T))) == 2
        client.server_info(timeout=5)

    errors = _run_threads([worker] * NUM_THREADS)
    assert not errors, errors[:3]
    a, b = tables[0].info, tables[1].info
    total = NUM_THREADS * per_thread
    assert a.current_size == b.current_size == total
    assert a.rate_limiter_info.insert_stats.completed == total
    assert b.rate_limiter_info.insert_stats.completed == total
    assert a.rate_limiter_info.sample_stats.completed == NUM_THREADS * 3
    assert b.rate_limiter_info.sample_stats.completed == NUM_THREADS * 2


def test_queue_producers_and_consumers_deliver_each_item_once(make_server):
    producers = consumers = NUM_THREADS // 2
    per_producer = 20
    per_consumer = producers * per_producer // consumers
    table = reverb.Table.queue("q", 8)
    server = make_server([table])
    received = []
    lock = threading.Lock()

    def producer(index):
        client = server.localhost_client()
        for j in range(per_producer):
            client.insert(np.int64(index * 1000 + j), {"q": 1.0}, timeout=T)

    def consumer(index):
        client = server.localhost_client()
        got = [int(s[0].data[0]) for s in client.sample("q", per_consumer, timeout=T)]
        with lock:
            received.extend(got)

    errors = _run_threads([producer] * producers + [consumer] * consumers)
    assert not errors, errors[:3]
    expected = sorted(i * 1000 + j for i in range(producers) for j in range(per_producer))
    assert sorted(received) == expected  # every item exactly once
    info = table.info
    assert info.current_size == 0
    assert info.rate_limiter_info.insert_stats.completed == len(expected)
    assert info.rate_limiter_info.sample_stats.completed == len(expected)
    assert info.num_unique_samples == len(expected)


def test_per_producer_order_is_preserved_through_a_queue(make_server):
    producers = 8
    per_producer = 25
    table = reverb.Table.queue("q", 4)
    server = make_server([table])
    received = []

    def producer(index):
        client = server.localhost_client()
        for j in range(per_producer):
            client.insert(np.array([index, j], dtype=np.int16), {"q": 1.0}, timeout=T)

    def consumer(_):
        client = server.localhost_client()
        for steps in client.sample("q", producers * per_producer, timeout=T):
            received.append(tuple(int(x) for x in steps[0].data[0]))

    errors = _run_threads([producer] * producers + [consumer])
    assert not errors, errors[:3]
    assert len(received) == producers * per_producer
    for index in range(producers):
        assert [j for i, j in received if i == index] == list(range(per_producer))


def _forked_child(address: str, out) -> None:
    """Runs in a child made by fork: samples and writes through new clients."""
    import numpy as np  # noqa: F401 - already imported by the parent; explicit for clarity

    got = [int(s.data[0]) for s in reverb.TrajectoryIterator(address, "q", max_samples=2)]
    with reverb.Client(address).trajectory_writer(1) as writer:
        writer.append({"x": np.int64(100)})
        writer.create_item("q", 1.0, writer.history["x"][-1])
    out.send(got)


def test_a_forked_child_uses_the_parents_server_through_new_clients(make_server):
    """A fork (e.g. a PyTorch DataLoader worker) gets its own client runtime and reaches a
    server of its parent over gRPC, not the copy of its tables it inherited."""
    import multiprocessing

    server = make_server([reverb.Table.queue("q", 10)])
    client = server.localhost_client()
    with client.trajectory_writer(1) as writer:  # starts the parent's runtime before the fork
        for t in range(2):
            writer.append({"x": np.int64(t)})
            writer.create_item("q", 1.0, writer.history["x"][-1])
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_forked_child, args=(f"localhost:{server.port}", send))
    child.start()
    try:
        assert receive.poll(T), "the forked child did not answer"
        assert receive.recv() == [0, 1]
        child.join(T)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
    # The child's item went to the parent's server; the items it sampled left it.
    assert [int(s.data[0]) for s in client.sample("q", 1, emit_timesteps=False, timeout=T)] == [100]
