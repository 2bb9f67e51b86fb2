"""Benchmark workloads, run by `bench/run.py` under one Python interpreter at a time: ours, or a
virtualenv holding dm-reverb 0.14 (the reference). Only the API both share is used, except
for workloads marked ours-only. Prints one JSON line with the result.

    python bench/workloads.py WORKLOAD MODE SECONDS
    MODE: inproc (server in this process) | remote (server in another process)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

import reverb

TABLE = "bench"
PRIORITIZED = "prioritized"


def make_tables(max_size: int = 1_000_000) -> list:
    return [
        reverb.Table(
            name=TABLE,
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            max_size=max_size,
            rate_limiter=reverb.rate_limiters.MinSize(1),
        ),
        reverb.Table(
            name=PRIORITIZED,
            sampler=reverb.selectors.Prioritized(0.6),
            remover=reverb.selectors.Fifo(),
            max_size=max_size,
            rate_limiter=reverb.rate_limiters.MinSize(1),
        ),
    ]


def serve(port_file: str, max_size: int) -> None:
    server = reverb.Server(make_tables(max_size))
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.port))
    os.rename(port_file + ".tmp", port_file)
    server.wait()


class Setup:
    """A server (here or in a child process) and its address."""

    def __init__(self, mode: str, max_size: int = 1_000_000) -> None:
        self.child = None
        if mode == "inproc":
            self.server = reverb.Server(make_tables(max_size))
            self.address = f"localhost:{self.server.port}"
            return
        port_file = f"/tmp/reverb-bench-port-{os.getpid()}"
        if os.path.exists(port_file):
            os.remove(port_file)
        self.child = subprocess.Popen(
            [sys.executable, __file__, "serve", port_file, str(max_size)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            if time.time() > deadline or self.child.poll() is not None:
                raise RuntimeError("benchmark server did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            self.address = f"localhost:{f.read()}"
        os.remove(port_file)

    def close(self) -> None:
        if self.child is not None:
            self.child.kill()
            self.child.wait()


def last_two(history: dict) -> dict:
    """The 2-step trajectory of the small-step workloads."""
    return {
        "obs": history["obs"][-2:],
        "action": history["action"][-2:],
        "reward": history["reward"][-2:],
    }


def writer_small(setup: Setup, seconds: float) -> dict:
    """Small steps (obs float32[8], action int32, reward float32), 2-step items."""
    client = reverb.Client(setup.address)
    obs = np.zeros(8, np.float32)
    steps = 0
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        start = time.perf_counter()
        while True:
            for _ in range(1000):
                writer.append({"obs": obs, "action": np.int32(steps), "reward": np.float32(1.0)})
                if writer.episode_steps >= 2:
                    writer.create_item(TABLE, 1.0, last_two(writer.history))
                steps += 1
            if time.perf_counter() - start > seconds:
                break
        writer.flush()
        elapsed = time.perf_counter() - start
    return {"value": steps / elapsed, "unit": "steps/s"}


def writer_frames(setup: Setup, seconds: float) -> dict:
    """84x84 uint8 frames, 10-step items every step."""
    client = reverb.Client(setup.address)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (84, 84), dtype=np.uint8) for _ in range(16)]
    steps = 0
    with client.trajectory_writer(num_keep_alive_refs=10) as writer:
        start = time.perf_counter()
        while True:
            for _ in range(100):
                writer.append({"frame": frames[steps % 16]})
                if writer.episode_steps >= 10:
                    writer.create_item(TABLE, 1.0, {"frame": writer.history["frame"][-10:]})
                steps += 1
                if steps % 1000 == 0:
                    writer.end_episode()
            if time.perf_counter() - start > seconds:
                break
        writer.flush()
        elapsed = time.perf_counter() - start
    return {"value": steps * 84 * 84 / elapsed / 1e6, "unit": "MB/s"}


def writer_batched(setup: Setup, seconds: float) -> dict:
    """Ours only: append_steps with 1000 small steps per call (appends only, no items)."""
    client = reverb.Client(setup.address)
    n = 1000
    batch = {
        "obs": np.zeros((n, 8), np.float32),
        "action": np.zeros(n, np.int32),
        "reward": np.ones(n, np.float32),
    }
    steps = 0
    with client.trajectory_writer(num_keep_alive_refs=n) as writer:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            writer.append_steps(batch)
            steps += n
            writer.end_episode()
        writer.flush()
        elapsed = time.perf_counter() - start
    return {"value": steps / elapsed, "unit": "steps/s"}


def client_sample(setup: Setup, seconds: float) -> dict:
    """Client.sample of small 2-step items, 256 per call."""
    client = reverb.Client(setup.address)
    obs = np.zeros(8, np.float32)
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(2000):
            writer.append({"obs": obs, "action": np.int32(t), "reward": np.float32(1.0)})
            if t >= 1:
                writer.create_item(TABLE, 1.0, last_two(writer.history))
    samples = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in client.sample(TABLE, num_samples=256, emit_timesteps=False):
            samples += 1
    return {"value": samples / (time.perf_counter() - start), "unit": "samples/s"}


def prioritized(setup: Setup, seconds: float) -> dict:
    """Learner loop on a prioritized table (exponent 0.6): sample 256, update 256 priorities."""
    client = reverb.Client(setup.address)
    obs = np.zeros(8, np.float32)
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(5000):
            writer.append({"obs": obs, "action": np.int32(t), "reward": np.float32(1.0)})
            if t >= 1:
                writer.create_item(PRIORITIZED, 1.0, last_two(writer.history))
    rng = np.random.default_rng(0)
    samples = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        keys = [s.info.key for s in client.sample(PRIORITIZED, 256, emit_timesteps=False)]
        client.mutate_priorities(PRIORITIZED, dict(zip(keys, rng.random(len(keys)).tolist())))
        samples += len(keys)
    return {"value": samples / (time.perf_counter() - start), "unit": "samples/s"}


WORKLOADS = {
    "writer_small": writer_small,
    "writer_frames": writer_frames,
    "writer_batched": writer_batched,
    "client_sample": client_sample,
    "prioritized": prioritized,
}
OURS_ONLY = {"writer_batched"}


def main() -> None:
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    workload, mode, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    setup = Setup(mode)
    try:
        result = WORKLOADS[workload](setup, seconds)
    finally:
        setup.close()
    print(json.dumps({"workload": workload, "mode": mode, **result}))
    sys.stdout.flush()
    os._exit(0)  # do not wait for servers' background threads


if __name__ == "__main__":
    main()
