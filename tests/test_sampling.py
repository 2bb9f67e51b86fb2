"""Selector semantics end to end through a served table."""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest
from _metrics import waiting
from _wait import wait_for

import reverb
from reverb import rate_limiters, selectors

# Every test runs twice: sampling this process's server directly, and over gRPC.
pytestmark = pytest.mark.usefixtures("both_paths")

T = 10.0


def _frequencies(client, table, n):
    counts = collections.Counter()
    probabilities = collections.defaultdict(set)
    for steps in client.sample(table, n, timeout=T):
        value = int(steps[0].data[0])
        counts[value] += 1
        probabilities[value].add(steps[0].info.probability)
    assert sum(counts.values()) == n
    return {v: c / n for v, c in counts.items()}, probabilities


def _table(name, sampler, remover=None, max_size=1000, max_times_sampled=0, min_size=1):
    return reverb.Table(
        name=name,
        sampler=sampler,
        remover=remover or selectors.Fifo(),
        max_size=max_size,
        rate_limiter=rate_limiters.MinSize(min_size),
        max_times_sampled=max_times_sampled,
    )


# --- Selector objects ----------------------------------------------------------------------------


def test_selector_reprs_and_validation():
    assert repr(selectors.Prioritized(0.8)) == "PrioritizedSelector(priority_exponent=0.8)"
    assert repr(selectors.MinHeap()) == "HeapSelector(sign=1)"
    assert repr(selectors.MaxHeap()) == "HeapSelector(sign=-1)"
    assert reverb.selectors is reverb.item_selectors
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            selectors.Prioritized(bad)


# --- Uniform -------------------------------------------------------------------------------------


def test_uniform_frequencies_and_probability(client, insert):
    insert(client, "uniform", range(4))
    freq, probabilities = _frequencies(client, "uniform", 4000)
    assert set(freq) == {0, 1, 2, 3}
    for value in range(4):
        assert abs(freq[value] - 0.25) < 0.05, freq
        assert probabilities[value] == {0.25}


def test_uniform_probability_tracks_table_size(client, insert):
    for n in range(1, 6):
        insert(client, "uniform", [n])
        samples = list(client.sample("uniform", 5, timeout=T))
        assert len(samples) == 5
        for steps in samples:
            assert steps[0].info.probability == pytest.approx(1.0 / n)
            assert steps[0].info.table_size == n


# --- Prioritized ---------------------------------------------------------------------------------


def test_prioritized_frequencies_and_probability(client, insert):
    priorities = [1.0, 2.0, 3.0, 4.0]
    insert(client, "prioritized", range(4), priorities=priorities)
    weights = [p**0.8 for p in priorities]
    expected = [w / sum(weights) for w in weights]
    freq, probabilities = _frequencies(client, "prioritized", 4000)
    for value in range(4):
        assert abs(freq[value] - expected[value]) < 0.04, (freq, expected)
        (probability,) = probabilities[value]
        assert probability == pytest.approx(expected[value], rel=1e-9)


def test_prioritized_exponent_zero_is_uniform_over_non_zero_priorities(make_server):
    table = _table("p", selectors.Prioritized(0.0))
    client = make_server([table]).localhost_client()
    for value, priority in enumerate([0.5, 10.0, 0.0, 3.0]):
        client.insert(np.int64(value), {"p": priority}, timeout=T)
    freq, probabilities = _frequencies(client, "p", 1500)
    assert set(freq) == {0, 1, 3}  # 0 ** 0 is 0: priority 0 is never sampled
    for value in (0, 1, 3):
        assert abs(freq[value] - 1 / 3) < 0.06
        (probability,) = probabilities[value]
        assert probability == pytest.approx(1 / 3)


def test_prioritized_probabilities_follow_updates_and_deletes(client, insert, tables):
    insert(client, "prioritized", range(4), priorities=[1.0, 2.0, 3.0, 4.0])
    keys = {}
    while len(keys) < 4:
        for steps in client.sample("prioritized", 20, timeout=T):
            keys[int(steps[0].data[0])] = steps[0].info.key
    client.mutate_priorities("prioritized", updates={keys[0]: 5.0}, deletes=[keys[3]], timeout=T)
    assert tables["prioritized"].info.current_size == 3
    weights = {0: 5.0**0.8, 1: 2.0**0.8, 2: 3.0**0.8}
    total = sum(weights.values())
    freq, probabilities = _frequencies(client, "prioritized", 3000)
    assert set(freq) == {0, 1, 2}
    for value, weight in weights.items():
        (probability,) = probabilities[value]
        assert probability == pytest.approx(weight / total, rel=1e-9)
        assert abs(freq[value] - weight / total) < 0.045


def test_priority_zero_is_never_sampled(client, insert):
    insert(client, "prioritized", [0, 1, 2], priorities=[0.0, 1.0, 0.0])
    freq, probabilities = _frequencies(client, "prioritized", 500)
    assert freq == {1: 1.0}
    assert probabilities[1] == {1.0}


def test_prioritized_all_zero_priorities_fall_back_to_uniform(client, insert):
    insert(client, "prioritized", [0, 1], priorities=[0.0, 0.0])
    freq, probabilities = _frequencies(client, "prioritized", 1000)
    assert set(freq) == {0, 1}
    for value in (0, 1):
        assert abs(freq[value] - 0.5) < 0.08
        assert probabilities[value] == {0.5}


# --- Fifo / Lifo ---------------------------------------------------------------------------------


def test_fifo_and_lifo_samplers_pick_oldest_and_newest(make_server, insert, sample_values):
    server = make_server([_table("fifo", selectors.Fifo()), _table("lifo", selectors.Lifo())])
    client = server.localhost_client()
    for value in (5, 3, 9, 1):
        client.insert(np.int64(value), {"fifo": 1.0, "lifo": 1.0}, timeout=T)
    # Without max_times_sampled nothing is removed, so the same item keeps coming back.
    assert sample_values(client, "fifo", 3) == [5, 5, 5]
    assert sample_values(client, "lifo", 3) == [1, 1, 1]
    samples = list(client.sample("fifo", 2, timeout=T))
    assert len(samples) == 2
    for steps in samples:
        assert steps[0].info.probability == 1.0


def test_fifo_sampler_order_with_deletes(make_server, sample_values):
    table = _table("fifo", selectors.Fifo(), max_times_sampled=1)
    client = make_server([table]).localhost_client()
    for value in range(6):
        client.insert(np.int64(value), {"fifo": 1.0}, timeout=T)
    assert sample_values(client, "fifo", 6) == list(range(6))
    assert table.info.current_size == 0


# --- Heaps ---------------------------------------------------------------------------------------


def test_min_and_max_heap_pick_lowest_and_highest_priority(client, insert, sample_values):
    priorities = [3.0, -1.0, 7.5, 2.0, 7.0]
    insert(client, "min_heap", range(5), priorities=priorities)
    insert(client, "max_heap", range(5), priorities=priorities)
    assert sample_values(client, "min_heap", 3) == [1, 1, 1]
    assert sample_values(client, "max_heap", 3) == [2, 2, 2]
    for table in ("min_heap", "max_heap"):
        (steps,) = list(client.sample(table, 1, timeout=T))
        assert steps[0].info.probability == 1.0


def test_heap_ties_go_to_least_recently_inserted(client, insert, sample_values):
    insert(client, "min_heap", [0, 1, 2, 3], priorities=[2.0, 1.0, 1.0, 1.0])
    insert(client, "max_heap", [0, 1, 2, 3], priorities=[1.0, 5.0, 5.0, 5.0])
    assert sample_values(client, "min_heap", 1) == [1]
    assert sample_values(client, "max_heap", 1) == [1]


def test_heap_ties_go_to_least_recently_updated(client, insert):
    insert(client, "min_heap", [0, 1, 2], priorities=[1.0, 1.0, 1.0])
    insert(client, "max_heap", [0, 1, 2], priorities=[1.0, 1.0, 1.0])
    for table in ("min_heap", "max_heap"):
        order = []
        for _ in range(6):
            (steps,) = list(client.sample(table, 1, timeout=T))
            order.append(int(steps[0].data[0]))
            # Re-setting the same priority makes the item the most recently updated one.
            client.mutate_priorities(table, updates={steps[0].info.key: 1.0}, timeout=T)
        assert order == [0, 1, 2, 0, 1, 2], table


# --- max_times_sampled ---------------------------------------------------------------------------


def test_max_times_sampled_deletes_after_n_samples(client, insert, tables):
    insert(client, "max_times_sampled", [0, 1, 2])
    counts = collections.Counter()
    times = collections.defaultdict(list)
    for steps in client.sample("max_times_sampled", 6, timeout=T):
        value = int(steps[0].data[0])
        counts[value] += 1
        times[value].append(steps[0].info.times_sampled)
    assert counts == {0: 2, 1: 2, 2: 2}
    assert all(t == [1, 2] for t in times.values())
    info = tables["max_times_sampled"].info
    assert info.current_size == 0
    assert info.num_deleted_episodes == 3
    assert info.rate_limiter_info.sample_stats.completed == 6
    with pytest.raises(reverb.errors.DeadlineExceededError):
        list(client.sample("max_times_sampled", 1, timeout=0.2))


def test_max_times_sampled_reports_table_size_before_deletion(client, insert, tables):
    insert(client, "max_times_sampled", [7])
    sizes = [s[0].info.table_size for s in client.sample("max_times_sampled", 2, timeout=T)]
    assert sizes == [1, 1]
    assert tables["max_times_sampled"].info.current_size == 0


# --- Eviction ------------------------------------------------------------------------------------


def test_fifo_remover_evicts_oldest(make_server, sample_values):
    table = _table("t", selectors.Fifo(), remover=selectors.Fifo(), max_size=3, max_times_sampled=1)
    client = make_server([table]).localhost_client()
    for value in range(5):
        client.insert(np.int64(value), {"t": 1.0}, timeout=T)
    info = table.info
    assert info.current_size == 3
    assert info.num_deleted_episodes == 2
    assert info.rate_limiter_info.insert_stats.completed == 5
    assert sample_values(client, "t", 3) == [2, 3, 4]


def test_lifo_remover_lets_new_item_evict_itself(make_server, sample_values):
    table = _table("t", selectors.Fifo(), remover=selectors.Lifo(), max_size=3, max_times_sampled=1)
    client = make_server([table]).localhost_client()
    for value in range(5):
        client.insert(np.int64(value), {"t": 1.0}, timeout=T)
    info = table.info
    assert info.current_size == 3
    assert info.num_deleted_episodes == 2
    assert info.rate_limiter_info.insert_stats.completed == 5
    assert sample_values(client, "t", 3) == [0, 1, 2]


def test_min_heap_remover_evicts_lowest_priority(make_server, sample_values):
    table = _table(
        "t", selectors.Fifo(), remover=selectors.MinHeap(), max_size=3, max_times_sampled=1
    )
    client = make_server([table]).localhost_client()
    for value, priority in enumerate([5.0, 1.0, 4.0, 2.0, 3.0]):
        client.insert(np.int64(value), {"t": priority}, timeout=T)
    assert table.info.current_size == 3
    assert sample_values(client, "t", 3) == [0, 2, 4]


def test_uniform_table_never_exceeds_max_size(make_server):
    table = _table("t", selectors.Uniform(), max_size=4)
    client = make_server([table]).localhost_client()
    for value in range(20):
        client.insert(np.int64(value), {"t": 1.0}, timeout=T)
        assert table.info.current_size == min(value + 1, 4)
    freq, _ = _frequencies(client, "t", 200)
    assert set(freq) == {16, 17, 18, 19}


# --- Queue / Stack -------------------------------------------------------------------------------


def test_queue_is_fifo_and_samples_each_item_once(client, insert, tables, sample_values):
    insert(client, "queue", range(5))
    assert sample_values(client, "queue", 5) == [0, 1, 2, 3, 4]
    info = tables["queue"].info
    assert info.current_size == 0
    assert info.num_unique_samples == 5
    assert not tables["queue"].can_sample(1)
    with pytest.raises(reverb.errors.DeadlineExceededError):
        list(client.sample("queue", 1, timeout=0.2))


def test_stack_is_lifo_and_samples_each_item_once(client, insert, tables, sample_values):
    insert(client, "stack", range(5))
    assert sample_values(client, "stack", 3) == [4, 3, 2]
    insert(client, "stack", [10])
    assert sample_values(client, "stack", 3) == [10, 1, 0]
    assert tables["stack"].info.current_size == 0
    with pytest.raises(reverb.errors.DeadlineExceededError):
        list(client.sample("stack", 1, timeout=0.2))


def test_queue_insert_blocks_until_a_sample_frees_space(make_server, sample_values):
    table = reverb.Table.queue("q", 2)
    server = make_server([table], metrics_port=0)
    client = server.localhost_client()
    for value in (0, 1):
        client.insert(np.int64(value), {"q": 1.0}, timeout=T)
    done = threading.Event()
    errors = []

    def producer():
        try:
            server.localhost_client().insert(np.int64(2), {"q": 1.0}, timeout=T)
        except Exception as e:  # recorded and asserted below
            errors.append(e)
        done.set()

    thread = threading.Thread(target=producer)
    thread.start()
    wait_for(lambda: waiting(server.metrics_port, "q", "insert") == 1, T, "the insert to block")
    assert not done.is_set(), "insert into a full queue must block"
    assert table.info.current_size == 2
    assert sample_values(client, "q", 1) == [0]
    assert done.wait(5), "the blocked insert must complete once space is freed"
    thread.join(timeout=T)
    assert not errors
    assert sample_values(client, "q", 2) == [1, 2]
    assert table.info.rate_limiter_info.insert_stats.completed == 3


def test_queue_sample_blocks_until_an_insert(make_server):
    table = reverb.Table.queue("q", 2)
    server = make_server([table], metrics_port=0)
    result = []

    def consumer():
        for steps in server.localhost_client().sample("q", 1, timeout=T):
            result.append(int(steps[0].data[0]))

    thread = threading.Thread(target=consumer)
    thread.start()
    wait_for(lambda: waiting(server.metrics_port, "q", "sample") == 1, T, "the sample to block")
    assert thread.is_alive() and not result
    server.localhost_client().insert(np.int64(42), {"q": 1.0}, timeout=T)
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert result == [42]


def test_sample_timeout_loses_no_queue_items(make_server):
    """Regression: a batch timing out part-way used to drop the items it had taken."""
    table = reverb.Table.queue("q", 10)
    client = make_server([table]).localhost_client()
    for value in (0, 1):
        client.insert(np.int64(value), {"q": 1.0}, timeout=T)
    received = []
    with pytest.raises(reverb.errors.DeadlineExceededError):
        for steps in client.sample("q", 5, timeout=0.3):
            received.append(int(steps[0].data[0]))
    consumed = table.info.rate_limiter_info.sample_stats.completed
    assert consumed == 2
    assert received == [0, 1]


def test_stopping_iteration_early_consumes_few_extra_queue_items(make_server):
    """Regression: prefetched batches of up to 256 items used to be consumed and dropped."""
    table = reverb.Table.queue("q", 40)
    client = make_server([table]).localhost_client()
    for value in range(40):
        client.insert(np.int64(value), {"q": 1.0}, timeout=T)
    received = []
    for steps in client.sample("q", 40, timeout=T):
        received.append(int(steps[0].data[0]))
        if len(received) == 16:
            break
    assert received == list(range(16))
    # The reference's sampler keeps at most one sample in flight per worker (plus one
    # buffered): stopping early may consume a couple of extra items, not dozens.
    consumed = table.info.rate_limiter_info.sample_stats.completed
    assert consumed <= 18, consumed
    assert table.info.current_size >= 22
