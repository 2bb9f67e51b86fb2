"""The Prometheus endpoint, scraped as Prometheus would, and the periodic stats log."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
from _metrics import scrape, waiting
from _wait import wait_for

import reverb

T = 10.0


def test_metrics_follow_the_tables() -> None:
    tables = [
        reverb.Table(
            "replay",
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            max_size=3,
            rate_limiter=reverb.rate_limiters.MinSize(2),
        ),
        reverb.Table.queue("queue", 1),
    ]
    server = reverb.Server(tables, metrics_port=0)
    try:
        port = server.metrics_port
        assert port and port != server.port
        client = reverb.Client(f"localhost:{server.port}")
        m = scrape(port)
        assert m['reverb_table_size{table="replay"}'] == 0
        assert m['reverb_table_max_size{table="replay"}'] == 3
        assert m['reverb_table_blocked{table="replay",call="sample",reason="too_few_items"}'] == 1
        assert m['reverb_table_blocked{table="replay",call="insert",reason="none"}'] == 0
        for i in range(5):
            client.insert(np.full(1000, i, np.float32), {"replay": 1.0}, timeout=T)
        client.insert(np.int32(1), {"queue": 1.0}, timeout=T)
        list(client.sample("replay", 4, timeout=T))
        # A second insert into the full queue waits on its rate limiter.
        blocked = threading.Thread(
            target=lambda: client.insert(np.int32(2), {"queue": 1.0}, timeout=3), daemon=True
        )
        blocked.start()
        wait_for(lambda: waiting(port, "queue", "insert") == 1, T, "the insert to block")
        m = scrape(port)
        assert m['reverb_table_inserts_waiting{table="queue"}'] == 1
        assert (
            m['reverb_table_blocked{table="queue",call="insert",reason="sample_to_insert_ratio"}']
            == 1
        )
        assert m['reverb_table_size{table="replay"}'] == 3
        assert m['reverb_table_inserts_total{table="replay"}'] == 5
        assert m['reverb_table_deletes_total{table="replay"}'] == 2
        assert m['reverb_table_samples_total{table="replay"}'] == 4
        assert m['reverb_table_blocked{table="replay",call="sample",reason="none"}'] == 0
        assert m["reverb_chunk_bytes"] > 0
        assert m["reverb_chunks"] >= 3
        next(client.sample("queue", timeout=T))
        blocked.join(T)
        assert not blocked.is_alive()
        m = scrape(port)
        assert m['reverb_table_inserts_waiting{table="queue"}'] == 0
        assert m['reverb_table_wait_seconds_total{table="queue",call="insert"}'] > 0
    finally:
        server.stop()


def test_a_metrics_port_that_is_taken_fails_the_start() -> None:
    server = reverb.Server([reverb.Table.queue("q", 1)], metrics_port=0)
    try:
        with pytest.raises(OSError, match="metrics port"):
            reverb.Server([reverb.Table.queue("q", 1)], metrics_port=server.metrics_port)
    finally:
        server.stop()


def test_stats_are_logged_when_asked() -> None:
    code = (
        "import time, reverb\n"
        "s = reverb.Server([reverb.Table.queue('q', 4)], log_stats_every=0.2)\n"
        "time.sleep(1.0)\n"  # a time: the log is periodic (every 0.2 s)
        "s.stop()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stderr.splitlines() if "table 'q'" in line]
    assert len(lines) >= 2, out.stderr
    assert "0 items (max 4)" in lines[0] and "samples blocked: too_few_items" in lines[0]
