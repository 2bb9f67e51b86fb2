"""Thousands of short calls on one connection to a server in another process keep working
(driving gRPC calls from the caller's thread once failed after a few thousand with HTTP/2
ENHANCE_YOUR_CALM)."""

from __future__ import annotations

import pathlib

import numpy as np
from _standalone import start, stop

import reverb

CALLS = 20000


def test_thousands_of_samples_and_priority_updates_on_one_connection(
    tmp_path: pathlib.Path,
) -> None:
    config = {
        "port": 0,
        "tables": [{"name": "t", "sampler": "uniform", "remover": "fifo", "max_size": 100}],
    }
    proc, port, lines = start(config, tmp_path)
    try:
        client = reverb.Client(f"localhost:{port}")
        client.insert(np.arange(4, dtype=np.float32), {"t": 1.0})
        for i in range(CALLS):
            sample = next(client.sample("t", 1, emit_timesteps=False))
            if i % 20 == 0:
                client.mutate_priorities("t", {sample.info.key: 1.0 + i}, timeout=10)
        assert sample.data[0].tolist() == [[0.0, 1.0, 2.0, 3.0]]
        assert client.server_info(timeout=10)["t"].current_size == 1
    finally:
        stop(proc, lines)
