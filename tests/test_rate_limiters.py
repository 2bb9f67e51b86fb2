"""Rate limiters: Python-side validation, and the exact §1.4 inequalities on a served table."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reverb
from reverb import rate_limiters, selectors

FLOAT_MAX = sys.float_info.max


def _params(limiter):
    return (
        limiter.samples_per_insert,
        limiter.min_size_to_sample,
        limiter.min_diff,
        limiter.max_diff,
    )


# --- MinSize -------------------------------------------------------------------------------------


def test_min_size_bounds():
    assert _params(rate_limiters.MinSize(3)) == (1.0, 3, -FLOAT_MAX, FLOAT_MAX)


@pytest.mark.parametrize("min_size", [0, -1, -100])
def test_min_size_rejects_non_positive(min_size):
    with pytest.raises(ValueError, match="min_size_to_sample"):
        rate_limiters.MinSize(min_size)


# --- SampleToInsertRatio -------------------------------------------------------------------------


def test_sample_to_insert_ratio_scalar_error_buffer_example():
    limiter = rate_limiters.SampleToInsertRatio(2, 10, 5)
    assert _params(limiter) == (2.0, 10, 15.0, 25.0)


def test_sample_to_insert_ratio_tuple_error_buffer_used_as_is():
    limiter = rate_limiters.SampleToInsertRatio(1.5, 4, (-3.0, 12.5))
    assert _params(limiter) == (1.5, 4, -3.0, 12.5)


@pytest.mark.parametrize("spi", [0, 0.0, -1.0, -0.5])
def test_sample_to_insert_ratio_rejects_non_positive_spi(spi):
    with pytest.raises(ValueError, match="samples_per_insert"):
        rate_limiters.SampleToInsertRatio(spi, 10, 5)


@pytest.mark.parametrize(
    "spi, min_size, error_buffer",
    [
        (2.0, 10, 1.9),  # 2 * 1.9 < 2 * max(1, 2)
        (0.5, 1, 0.99),  # 2 * 0.99 < 2 * max(1, 0.5)
        (1.0, 5, (0.0, 1.5)),  # width 1.5 < 2
        (3.0, 2, (0.0, 5.99)),  # width 5.99 < 6
    ],
)
def test_sample_to_insert_ratio_rejects_too_small_buffer(spi, min_size, error_buffer):
    with pytest.raises(ValueError, match="error_buffer"):
        rate_limiters.SampleToInsertRatio(spi, min_size, error_buffer)


@pytest.mark.parametrize(
    "spi, min_size, error_buffer",
    [(2.0, 10, 2.0), (0.5, 1, 1.0), (1.0, 5, (0.0, 2.0)), (3.0, 2, (0.0, 6.0))],
)
def test_sample_to_insert_ratio_accepts_smallest_buffer(spi, min_size, error_buffer):
    limiter = rate_limiters.SampleToInsertRatio(spi, min_size, error_buffer)
    assert limiter.max_diff - limiter.min_diff == pytest.approx(2 * max(1.0, spi))


def test_sample_to_insert_ratio_rejects_deadlocking_min_diff():
    # min_diff 6 > spi * min_size = 5: sampling could never start.
    with pytest.raises(ValueError, match="deadlock"):
        rate_limiters.SampleToInsertRatio(1.0, 5, (6.0, 20.0))
    # The boundary min_diff == spi * min_size is allowed.
    assert rate_limiters.SampleToInsertRatio(1.0, 5, (5.0, 20.0)).min_diff == 5.0


@pytest.mark.parametrize("min_size", [0, -3])
def test_sample_to_insert_ratio_rejects_min_size_below_one(min_size):
    with pytest.raises(ValueError, match="min_size_to_sample"):
        rate_limiters.SampleToInsertRatio(1.0, min_size, 5.0)


def test_sample_to_insert_ratio_only_warns_when_max_diff_below_min_size(caplog):
    with caplog.at_level(logging.WARNING):
        limiter = rate_limiters.SampleToInsertRatio(1.0, 10, (-5.0, 5.0))
    assert _params(limiter) == (1.0, 10, -5.0, 5.0)
    assert any("min_size_to_sample" in r.getMessage() for r in caplog.records)


def test_sample_to_insert_ratio_no_warning_in_normal_range(caplog):
    with caplog.at_level(logging.WARNING):
        rate_limiters.SampleToInsertRatio(2, 10, 5)
    assert not caplog.records


# --- Queue / Stack / RateLimiter -----------------------------------------------------------------


@pytest.mark.parametrize("cls", [rate_limiters.Queue, rate_limiters.Stack])
def test_queue_and_stack_bounds(cls):
    assert _params(cls(5)) == (1.0, 1, 0.0, 5.0)


@pytest.mark.parametrize("cls", [rate_limiters.Queue, rate_limiters.Stack])
@pytest.mark.parametrize("size", [0, -1])
def test_queue_and_stack_reject_size_below_one(cls, size):
    with pytest.raises(ValueError, match="size"):
        cls(size)


def test_rate_limiter_rejects_min_diff_above_max_diff():
    with pytest.raises(ValueError, match="min_diff"):
        rate_limiters.RateLimiter(1.0, 1, 5.0, 4.0)


def test_rate_limiter_rejects_bad_spi_and_min_size():
    with pytest.raises(ValueError):
        rate_limiters.RateLimiter(0.0, 1, 0.0, 4.0)
    with pytest.raises(ValueError):
        rate_limiters.RateLimiter(1.0, 0, 0.0, 4.0)


def test_table_reports_rate_limiter_settings():
    table = reverb.Table(
        "t",
        selectors.Uniform(),
        selectors.Fifo(),
        100,
        rate_limiters.SampleToInsertRatio(2, 10, 5),
    )
    info = table.info.rate_limiter_info
    assert (info.samples_per_insert, info.min_size_to_sample) == (2.0, 10)
    assert (info.min_diff, info.max_diff) == (15.0, 25.0)


def test_sample_to_insert_ratio_example_on_a_served_table(make_server):
    """SampleToInsertRatio(2, 10, 5): 10 inserts allow exactly 5 samples; 15 inserts then
    block the 16th."""
    table = reverb.Table(
        "t", selectors.Fifo(), selectors.Fifo(), 100, rate_limiters.SampleToInsertRatio(2, 10, 5)
    )
    server = make_server([table])
    client = server.localhost_client()
    for i in range(10):
        assert not table.can_sample(1)
        assert table.can_insert(1)
        client.insert(np.int32(i), {"t": 1.0}, timeout=10)
    assert table.can_sample(5)
    assert not table.can_sample(6)
    taken = 0
    while table.can_sample(1):
        list(client.sample("t", 1, timeout=10))
        taken += 1
        assert taken <= 5
    assert taken == 5
    for i in range(5):  # (10 + k) * 2 - 5 <= 25 for k <= 5
        assert table.can_insert(1)
        client.insert(np.int32(i), {"t": 1.0}, timeout=10)
    assert not table.can_insert(1)
    with pytest.raises(reverb.DeadlineExceededError):
        client.insert(np.int32(99), {"t": 1.0}, timeout=0.2)
    info = table.info.rate_limiter_info
    assert info.insert_stats.completed == 15
    assert info.sample_stats.completed == 5


# --- Property test: a served table against a Python model of the counters ------------------------


class _Model:
    """The reference rate limiter (§1.4) plus a FIFO table with max_size/max_times_sampled."""

    def __init__(self, spi, min_size, min_diff, max_diff, max_size, max_times_sampled):
        self.spi = spi
        self.min_size = min_size
        self.min_diff = min_diff
        self.max_diff = max_diff
        self.max_size = max_size
        self.max_times_sampled = max_times_sampled
        self.inserts = self.samples = self.deletes = 0
        self.items = []  # [value, times_sampled, key or None], oldest first

    def can_sample(self, n):
        if self.inserts - self.deletes < self.min_size:
            return False
        return self.inserts * self.spi - self.samples - n >= self.min_diff

    def can_insert(self, n):
        if self.inserts + n - self.deletes <= self.min_size:
            return True
        return (self.inserts + n) * self.spi - self.samples <= self.max_diff

    def delete_front(self):
        self.items.pop(0)
        self.deletes += 1


@st.composite
def _scenarios(draw):
    spi = draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]))
    min_size = draw(st.integers(1, 4))
    # Mostly bands that let both inserts and samples progress, sometimes arbitrary ones.
    if draw(st.booleans()):
        min_diff = spi * min_size - draw(st.integers(0, 10)) / 2
    else:
        min_diff = draw(st.integers(-8, 8)) / 2
    max_diff = min_diff + draw(st.integers(0, 16)) / 2
    max_size = draw(st.integers(1, 8))
    max_times_sampled = draw(st.integers(0, 3))
    op = st.sampled_from(["insert"] * 4 + ["sample"] * 4 + ["delete", "noop_delete"])
    ops = draw(st.lists(op, min_size=15, max_size=40))
    return spi, min_size, min_diff, max_diff, max_size, max_times_sampled, ops


@settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(_scenarios())
def test_served_table_follows_rate_limiter_inequalities(scenario):
    spi, min_size, min_diff, max_diff, max_size, max_times_sampled, ops = scenario
    model = _Model(spi, min_size, min_diff, max_diff, max_size, max_times_sampled)
    table = reverb.Table(
        "t",
        sampler=selectors.Fifo(),
        remover=selectors.Fifo(),
        max_size=max_size,
        rate_limiter=rate_limiters.RateLimiter(spi, min_size, min_diff, max_diff),
        max_times_sampled=max_times_sampled,
    )
    server = reverb.Server([table])
    try:
        client = server.localhost_client()
        forgotten_keys = []
        next_value = 0

        def check():
            for n in (1, 2, 3, 5):
                assert table.can_insert(n) == model.can_insert(n), (n, model.__dict__)
                assert table.can_sample(n) == model.can_sample(n), (n, model.__dict__)

        check()
        for op in ops:
            if op == "insert" and model.can_insert(1):
                client.insert(np.int64(next_value), {"t": 1.0}, timeout=5)
                model.inserts += 1
                model.items.append([next_value, 0, None])
                next_value += 1
                if len(model.items) > max_size:
                    model.delete_front()
            elif op == "sample" and model.can_sample(1):
                (steps,) = list(client.sample("t", 1, timeout=5))
                front = model.items[0]
                assert int(steps[0].data[0]) == front[0]
                front[1] += 1
                front[2] = steps[0].info.key
                model.samples += 1
                assert steps[0].info.times_sampled == front[1]
                if 0 < max_times_sampled <= front[1]:
                    forgotten_keys.append(front[2])
                    model.delete_front()
            elif op == "delete" and model.items and model.items[0][2] is not None:
                key = model.items[0][2]
                client.mutate_priorities("t", deletes=[key], timeout=5)
                forgotten_keys.append(key)
                model.delete_front()
            elif op == "noop_delete":
                # Keys no longer in the table (or never there) are ignored: no delete counted.
                client.mutate_priorities("t", deletes=forgotten_keys + [12345], timeout=5)
            check()

        info = table.info
        assert info.rate_limiter_info.insert_stats.completed == model.inserts
        assert info.rate_limiter_info.sample_stats.completed == model.samples
        assert info.current_size == len(model.items)
    finally:
        server.stop()
