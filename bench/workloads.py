"""Benchmark workloads, run by `bench/run.py` under one Python interpreter at a time: ours, or a
virtualenv holding dm-reverb 0.14 (the reference). Only the API both share is used, except
for workloads marked ours-only. Prints one JSON line with the result.

Writer workloads write, as users do, to tables with signatures (Acme and TF-Agents always
set them) through writers that validate items (the default), and end their episodes; the
`*_nosig` workloads are the same writers on a table without a signature.

    python bench/workloads.py WORKLOAD MODE SECONDS
    MODE: inproc (server in this process) | remote (server in another process)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

import numpy as np

import reverb

TABLE = "bench"  # no signature
PRIORITIZED = "prioritized"
# Tables with the signatures of the writer workloads' items.
SMALL = "small"  # obs float32[2, 8], action int32[2], reward float32[2]
FRAMES = "frames"  # frame uint8[10, 84, 84]
STRINGS = "strings"  # obs float32[2, 8], text string[2]
# The peers' cases (`../shared/notes/anchors.md`), one step per item.
TRANSITIONS = "transitions"  # obs float32[8], action int32, reward float32, next_obs float32[8]
FRAME_ITEMS = "frame_items"  # obs uint8[84, 84], reward float32
TRANSITION_QUEUE = "transition_queue"  # a FIFO queue (each item sampled once) of transitions
EPISODE = 1000  # steps per episode of the writer workloads


def make_tables(max_size: int = 1_000_000, structured: bool = False) -> list:
    """The benchmark tables (with `structured`, also the structured-writer workloads')."""
    extra = []
    if structured:
        import structured_workloads

        extra = structured_workloads.tables(max_size)
    import tensorflow as tf

    def table(name: str, signature: Optional[dict] = None) -> reverb.Table:
        return reverb.Table(
            name=name,
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            max_size=max_size,
            rate_limiter=reverb.rate_limiters.MinSize(1),
            signature=signature,
        )

    small = {
        "obs": tf.TensorSpec([2, 8], tf.float32),
        "action": tf.TensorSpec([2], tf.int32),
        "reward": tf.TensorSpec([2], tf.float32),
    }
    extra += [
        table(SMALL, small),
        table(FRAMES, {"frame": tf.TensorSpec([10, 84, 84], tf.uint8)}),
        table(
            STRINGS,
            {"obs": tf.TensorSpec([2, 8], tf.float32), "text": tf.TensorSpec([2], tf.string)},
        ),
        table(TRANSITIONS, transition_spec(tf)),
        table(FRAME_ITEMS, frame_item_spec(tf)),
        reverb.Table.queue(TRANSITION_QUEUE, 10_000, signature=transition_spec(tf)),
    ]
    return extra + [
        table(TABLE),
        reverb.Table(
            name=PRIORITIZED,
            sampler=reverb.selectors.Prioritized(0.6),
            remover=reverb.selectors.Fifo(),
            max_size=max_size,
            rate_limiter=reverb.rate_limiters.MinSize(1),
        ),
    ]


def transition_spec(tf) -> dict:
    return {
        "obs": tf.TensorSpec([8], tf.float32),
        "action": tf.TensorSpec([], tf.int32),
        "reward": tf.TensorSpec([], tf.float32),
        "next_obs": tf.TensorSpec([8], tf.float32),
    }


def frame_item_spec(tf) -> dict:
    return {"obs": tf.TensorSpec([84, 84], tf.uint8), "reward": tf.TensorSpec([], tf.float32)}


def serve(port_file: str, max_size: int, structured: bool) -> None:
    server = reverb.Server(make_tables(max_size, structured))
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.port))
    os.rename(port_file + ".tmp", port_file)
    server.wait()


def wait_for_address(server: subprocess.Popen, port_file: str, timeout: float) -> str:
    """The address of a server process that writes its port to `port_file` (as `serve`
    does), once written; the file is removed. RuntimeError if the process exits first or
    `timeout` seconds pass."""
    deadline = time.time() + timeout
    while not os.path.exists(port_file):
        if time.time() > deadline or server.poll() is not None:
            raise RuntimeError("benchmark server did not start")
        time.sleep(0.05)
    with open(port_file) as f:
        address = f"localhost:{f.read()}"
    os.remove(port_file)
    return address


class Setup:
    """A server (here or in a child process) and its address."""

    def __init__(self, mode: str, max_size: int = 1_000_000, structured: bool = False) -> None:
        self.child = None
        if mode == "inproc":
            self.server = reverb.Server(make_tables(max_size, structured))
            self.address = f"localhost:{self.server.port}"
            return
        port_file = f"/tmp/reverb-bench-port-{os.getpid()}"
        if os.path.exists(port_file):
            os.remove(port_file)
        self.child = subprocess.Popen(
            [sys.executable, __file__, "serve", port_file, str(max_size), str(int(structured))],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.address = wait_for_address(self.child, port_file, 60)

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


def _write_small(address: str, table: str, seconds: float, end_episodes: bool) -> tuple:
    """Small steps (obs float32[8], action int32, reward float32), a 2-step item every step,
    for `seconds`; returns (steps, seconds from the first append until all are confirmed)."""
    client = reverb.Client(address)
    obs = np.zeros(8, np.float32)
    steps = 0
    start = time.perf_counter()
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        while True:
            for _ in range(EPISODE):
                writer.append({"obs": obs, "action": np.int32(steps), "reward": np.float32(1.0)})
                if writer.episode_steps >= 2:
                    writer.create_item(table, 1.0, last_two(writer.history))
                steps += 1
            if end_episodes:
                writer.end_episode()
            if time.perf_counter() - start > seconds:
                break
        writer.flush()
    return steps, time.perf_counter() - start


def writer_small(setup: Setup, seconds: float) -> dict:
    """Small steps, 2-step items, episodes of 1000 steps, into a table with a signature."""
    steps, elapsed = _write_small(setup.address, SMALL, seconds, end_episodes=True)
    return {"value": steps / elapsed, "unit": "steps/s"}


def writer_small_nosig(setup: Setup, seconds: float) -> dict:
    """writer_small as it ran before signatures: no signature, one endless episode."""
    steps, elapsed = _write_small(setup.address, TABLE, seconds, end_episodes=False)
    return {"value": steps / elapsed, "unit": "steps/s"}


def writer_strings(setup: Setup, seconds: float) -> dict:
    """Small steps with a short byte string per step (obs float32[8], a 16-byte text),
    2-step items, episodes of 1000 steps."""
    client = reverb.Client(setup.address)
    obs = np.zeros(8, np.float32)
    texts = [f"instruction {i:04d}".encode() for i in range(100)]
    steps = 0
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        start = time.perf_counter()
        while True:
            for _ in range(1000):
                writer.append({"obs": obs, "text": texts[steps % 100]})
                if writer.episode_steps >= 2:
                    writer.create_item(
                        STRINGS, 1.0, {k: writer.history[k][-2:] for k in ("obs", "text")}
                    )
                steps += 1
            writer.end_episode()
            if time.perf_counter() - start > seconds:
                break
        writer.flush()
        elapsed = time.perf_counter() - start
    return {"value": steps / elapsed, "unit": "steps/s"}


def legacy_writer(setup: Setup, seconds: float) -> dict:
    """The legacy Writer (Client.writer): small steps, a 2-step item every step, one writer
    (episode) per 1000 steps."""
    client = reverb.Client(setup.address)
    obs = np.zeros(8, np.float32)
    steps = 0
    start = time.perf_counter()
    while True:
        with client.writer(max_sequence_length=2) as writer:
            for _ in range(1000):
                writer.append({"obs": obs, "action": np.int32(steps), "reward": np.float32(1.0)})
                if steps % 1000 >= 1:
                    writer.create_item(SMALL, 2, 1.0)
                steps += 1
        if time.perf_counter() - start > seconds:
            break
    elapsed = time.perf_counter() - start
    return {"value": steps / elapsed, "unit": "steps/s"}


def writer_frames(setup: Setup, seconds: float) -> dict:
    """84x84 uint8 frames, 10-step items every step, episodes of 1000 steps, into a table
    with a signature."""
    return _write_frames(setup, seconds, FRAMES)


def writer_frames_nosig(setup: Setup, seconds: float) -> dict:
    """writer_frames into a table without a signature."""
    return _write_frames(setup, seconds, TABLE)


def _write_frames(setup: Setup, seconds: float, table: str) -> dict:
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
                    writer.create_item(table, 1.0, {"frame": writer.history["frame"][-10:]})
                steps += 1
                if steps % EPISODE == 0:
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


def writer_vector(setup: Setup, seconds: float) -> dict:
    """Ours only: a vectorised environment of 256 small-step episodes; every step appends
    to all of them in one call and creates a 2-step item in each (256 items per call)."""
    client = reverb.Client(setup.address)
    n = 256
    step = {
        "obs": np.zeros((n, 8), np.float32),
        "action": np.zeros(n, np.int32),
        "reward": np.ones(n, np.float32),
    }
    with client.vector_trajectory_writer(n, num_keep_alive_refs=2) as writer:
        start = time.perf_counter()
        writer.append(step)
        steps = n
        trajectory = last_two(writer.history)
        while time.perf_counter() - start < seconds:
            for _ in range(50):
                writer.append(step)
                writer.create_item(SMALL, 1.0, trajectory)
                steps += n
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


def _fill_small(address: str, items: int = 2000) -> None:
    client = reverb.Client(address)
    obs = np.zeros(8, np.float32)
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(items + 1):
            writer.append({"obs": obs, "action": np.int32(t), "reward": np.float32(1.0)})
            if t >= 1:
                writer.create_item(TABLE, 1.0, last_two(writer.history))


def _iterate(dataset, seconds: float, per_batch: float) -> float:
    """Iterates `dataset` for `seconds` after a warm-up batch; returns units per second."""
    it = iter(dataset)
    next(it)
    done = 0.0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            next(it)
            done += per_batch
    return done / (time.perf_counter() - start)


def dataset_small(setup: Setup, seconds: float) -> dict:
    """TrajectoryDataset of small 2-step items, .batch(256)."""
    import tensorflow as tf

    _fill_small(setup.address)
    dataset = reverb.TrajectoryDataset(
        setup.address,
        TABLE,
        dtypes={"obs": tf.float32, "action": tf.int32, "reward": tf.float32},
        shapes={
            "obs": tf.TensorShape([2, 8]),
            "action": tf.TensorShape([2]),
            "reward": tf.TensorShape([2]),
        },
        max_in_flight_samples_per_worker=512,
    ).batch(256)
    return {"value": _iterate(dataset, seconds, 256), "unit": "samples/s"}


def dataset_frames(setup: Setup, seconds: float) -> dict:
    """TrajectoryDataset of 84x84x10 uint8 items, .batch(32)."""
    import tensorflow as tf

    client = reverb.Client(setup.address)
    rng = np.random.default_rng(0)
    with client.trajectory_writer(num_keep_alive_refs=10) as writer:
        for t in range(310):
            writer.append({"frame": rng.integers(0, 255, (84, 84), dtype=np.uint8)})
            if t >= 9:
                writer.create_item(TABLE, 1.0, {"frame": writer.history["frame"][-10:]})
    dataset = reverb.TrajectoryDataset(
        setup.address,
        TABLE,
        dtypes={"frame": tf.uint8},
        shapes={"frame": tf.TensorShape([10, 84, 84])},
        max_in_flight_samples_per_worker=64,
    ).batch(32)
    return {"value": _iterate(dataset, seconds, 32 * 10 * 84 * 84 / 1e6), "unit": "MB/s"}


def _fill_steps(address: str, table: str, n: int, step) -> None:
    """`n` items of one step each, `step(t)` the step, in episodes of EPISODE steps (as an
    actor writing transitions does: each step's columns are their own chunks)."""
    client = reverb.Client(address)
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for t in range(n):
            writer.append(step(t))
            writer.create_item(table, 1.0, {k: v[-1] for k, v in writer.history.items()})
            if t % EPISODE == EPISODE - 1:
                writer.end_episode()
        writer.flush()


def _numpy_batches(setup: Setup, table: str, spec) -> object:
    """Batches of 256 sampled items as numpy arrays, the fastest way each package offers:
    ours `TrajectoryIterator`, the reference's `TrajectoryDataset(...).batch(256)` as a
    numpy iterator."""
    if hasattr(reverb, "TrajectoryIterator"):
        return reverb.TrajectoryIterator(setup.address, table, batch_size=256)
    import tensorflow as tf

    specs = spec(tf)
    dataset = reverb.TrajectoryDataset(
        setup.address,
        table,
        dtypes={k: v.dtype for k, v in specs.items()},
        shapes={k: v.shape for k, v in specs.items()},
        max_in_flight_samples_per_worker=512,
    ).batch(256)
    return dataset.as_numpy_iterator()


def numpy_small(setup: Setup, seconds: float) -> dict:
    """Uniform batches of 256 small transitions as numpy arrays, from 100k items (random
    floats: the peers' small case)."""
    rng = np.random.default_rng(0)
    obs = rng.random((1001, 8), dtype=np.float32)
    _fill_steps(
        setup.address,
        TRANSITIONS,
        100_000,
        lambda t: {
            "obs": obs[t % 1000],
            "action": np.int32(t),
            "reward": np.float32(1.0),
            "next_obs": obs[t % 1000 + 1],
        },
    )
    it = _numpy_batches(setup, TRANSITIONS, transition_spec)
    return {"value": _iterate(it, seconds, 256), "unit": "samples/s"}


def numpy_frames(setup: Setup, seconds: float) -> dict:
    """Uniform batches of 256 items of one random 84x84 uint8 frame and a reward as numpy
    arrays, from 20k items (the peers' frame case)."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (997, 84, 84), dtype=np.uint8)
    _fill_steps(
        setup.address,
        FRAME_ITEMS,
        20_000,
        lambda t: {"obs": frames[t % 997], "reward": np.float32(t)},
    )
    it = _numpy_batches(setup, FRAME_ITEMS, frame_item_spec)
    return {"value": _iterate(it, seconds, 256), "unit": "samples/s"}


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


def _actor(address: str, seconds: float, go: str, out: str) -> None:
    """One actor process: waits for the file `go`, then writes small steps (2-step items,
    episodes of 1000 steps) to the signed table for `seconds`; writes its steps and the time
    from its first append until its last item was confirmed."""
    while not os.path.exists(go):
        time.sleep(0.001)
    steps, elapsed = _write_small(address, SMALL, seconds, end_episodes=True)
    with open(out, "w") as f:
        json.dump({"steps": steps, "seconds": elapsed}, f)


def _actors(setup: Setup, seconds: float, n: int) -> dict:
    """`n` actor processes, started together, write while a learner samples here."""
    tag = f"/tmp/reverb-bench-actor-{os.getpid()}"
    go = f"{tag}-go"
    outs = [f"{tag}-{i}" for i in range(n)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "actor", setup.address, str(seconds), go, out],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for out in outs
    ]
    time.sleep(1.0)  # the interpreters start; what they import before writing is not timed
    open(go, "w").close()
    client = reverb.Client(setup.address)
    start = time.perf_counter()
    samples = 0
    while any(p.poll() is None for p in procs) and time.perf_counter() - start < seconds * 5 + 60:
        try:
            if client.server_info()[SMALL].current_size:
                samples += sum(1 for _ in client.sample(SMALL, 256, emit_timesteps=False))
            else:
                time.sleep(0.01)
        except Exception:  # noqa: BLE001 - keep sampling while the actors run
            time.sleep(0.01)
    for p in procs:
        p.wait(60)
    os.remove(go)
    total = 0.0
    for out in outs:
        with open(out) as f:
            result = json.load(f)
        total += result["steps"] / result["seconds"]
        os.remove(out)
    return {"value": total, "unit": "steps/s", "learner_samples": samples}


def actors2(setup: Setup, seconds: float) -> dict:
    """2 actor processes writing small steps + 1 learner sampling."""
    return _actors(setup, seconds, 2)


def actors4(setup: Setup, seconds: float) -> dict:
    """4 actor processes writing small steps + 1 learner sampling."""
    return _actors(setup, seconds, 4)


def rss(pid: int) -> int:
    """The resident set size of process `pid`, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def memory(setup: Setup, seconds: float) -> dict:
    """Server RSS per stored small 2-step item (200k items; server in another process)."""
    return _memory(setup, 200_000)


def memory_1m(setup: Setup, seconds: float) -> dict:
    """Server RSS per stored small 2-step item (1M items; server in another process)."""
    return _memory(setup, 1_000_000)


def _memory(setup: Setup, n: int) -> dict:
    if setup.child is None:
        raise SystemExit("memory needs --modes remote (the server's RSS is measured)")
    client = reverb.Client(setup.address)
    before = rss(setup.child.pid)
    obs = np.zeros(8, np.float32)
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(n + 1):
            writer.append({"obs": obs, "action": np.int32(t), "reward": np.float32(1.0)})
            if writer.episode_steps >= 2:
                writer.create_item(TABLE, 1.0, last_two(writer.history))
            if t % 1000 == 999:
                writer.end_episode()
    time.sleep(0.5)
    return {"value": (rss(setup.child.pid) - before) / n, "unit": "bytes/item"}


def memory_frames(setup: Setup, seconds: float) -> dict:
    """Server RSS growth over the frame bytes stored (in %): 100,000 84x84 uint8 frames
    (706 MB) written as in writer_frames (10-step items every step, episodes of 1000 steps).
    A server's fixed costs (buffers, ~10 MB) weigh less the more it stores."""
    if setup.child is None:
        raise SystemExit("memory_frames needs --modes remote (the server's RSS is measured)")
    n = 100_000
    client = reverb.Client(setup.address)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (84, 84), dtype=np.uint8) for _ in range(16)]
    before = rss(setup.child.pid)
    with client.trajectory_writer(num_keep_alive_refs=10) as writer:
        for t in range(n):
            writer.append({"frame": frames[t % 16]})
            if writer.episode_steps >= 10:
                writer.create_item(FRAMES, 1.0, {"frame": writer.history["frame"][-10:]})
            if t % EPISODE == EPISODE - 1:
                writer.end_episode()
    time.sleep(0.5)
    return {"value": 100 * (rss(setup.child.pid) - before) / (n * 84 * 84), "unit": "%"}


def _percentiles(values: list) -> tuple:
    values = sorted(values)
    return values[len(values) // 2], values[int(len(values) * 0.99)]


def latency_insert(setup: Setup, seconds: float) -> dict:
    """p50 (p99 alongside) of one item's round trip: create_item + flush until confirmed."""
    client = reverb.Client(setup.address)
    obs = np.zeros(8, np.float32)
    times = []
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            writer.append({"obs": obs})
            t = time.perf_counter()
            writer.create_item(TABLE, 1.0, {"obs": writer.history["obs"][-1]})
            writer.flush()
            times.append(time.perf_counter() - t)
    p50, p99 = _percentiles(times)
    return {"value": p50 * 1e6, "unit": "us", "p99": p99 * 1e6}


def latency_sample(setup: Setup, seconds: float) -> dict:
    """p50 (p99 alongside) of a one-sample round trip with Client.sample."""
    client = reverb.Client(setup.address)
    client.insert(np.zeros(8, np.float32), {TABLE: 1.0})
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        next(client.sample(TABLE, 1, emit_timesteps=False))
        times.append(time.perf_counter() - t)
    p50, p99 = _percentiles(times)
    return {"value": p50 * 1e6, "unit": "us", "p99": p99 * 1e6}


def append_only(setup: Setup, seconds: float) -> dict:
    """Per-append cost of a 3-field small step (obs float32[8], action, reward) to a trajectory
    writer, with no items (so only appending is timed), in episodes of 1000 steps (their
    `end_episode` timed too); the cost of the benchmark's own loop is measured apart and
    taken off."""
    client = reverb.Client(setup.address)
    step = {"obs": np.zeros(8, np.float32), "action": np.int32(1), "reward": np.float32(1.0)}
    steps, elapsed = 0, 0.0
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        while elapsed < seconds:
            start = time.perf_counter()
            for _ in range(1000):
                writer.append(step)
            writer.end_episode()
            elapsed += time.perf_counter() - start
            steps += 1000
    start = time.perf_counter()
    for _ in range(steps):
        pass
    loop = time.perf_counter() - start
    return {"value": (elapsed - loop) / steps * 1e6, "unit": "us/append"}


def _least_runs(seconds: float) -> int:
    """The fewest fresh interpreters a wall-time workload starts: 3 for a median, 1 in a
    smoke run (under a second)."""
    return 3 if seconds >= 1 else 1


def import_time(setup: Setup, seconds: float) -> dict:
    """Wall time of `import reverb` in a fresh interpreter (median of a few), and its RSS."""
    del setup
    # (VmRSS, not ru_maxrss: the latter keeps the high-water mark of the forking process.)
    code = (
        "import time; t = time.perf_counter(); import reverb; t = time.perf_counter() - t; "
        "rss = [l for l in open('/proc/self/status') if l.startswith('VmRSS:')][0].split()[1]; "
        "print(t, rss)"
    )
    runs = []
    deadline = time.perf_counter() + seconds
    while len(runs) < _least_runs(seconds) or time.perf_counter() < deadline and len(runs) < 9:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        seconds_taken, rss_kib = out.stdout.split()
        runs.append((float(seconds_taken), int(rss_kib)))
    runs.sort()
    taken, rss = runs[len(runs) // 2]
    return {"value": taken * 1e3, "unit": "ms", "rss_mb": rss / 1024}


def dataset_setup(setup: Setup, seconds: float) -> dict:
    """Wall time, in a fresh interpreter (median of a few), to build an Acme-style dataset:
    `from_table_signature` and `.batch` inside a `tf.data` interleave, whose function (in a
    script file, as Acme's) TensorFlow's autograph converts."""
    built, _ = _setup_times(setup, seconds)
    return {"value": built * 1e3, "unit": "ms"}


def tfclient_trace(setup: Setup, seconds: float) -> dict:
    """Wall time, in a fresh interpreter (median of a few), of the first trace of a
    `tf.function` that samples with `TFClient`."""
    _, traced = _setup_times(setup, seconds)
    return {"value": traced * 1e3, "unit": "ms"}


def _setup_times(setup: Setup, seconds: float) -> tuple:
    # A script file, as Acme's code is: autograph converts only functions whose source it can
    # read (not those of `python -c`), and converting them is most of what this costs.
    code = f"""
import time, tensorflow as tf, reverb
addr, table = {setup.address!r}, {SMALL!r}
t = time.perf_counter()
def make(_):
    ds = reverb.TrajectoryDataset.from_table_signature(addr, table, 10)
    return ds.batch(32, drop_remainder=True)
ds = tf.data.Dataset.range(2).interleave(make, cycle_length=2, num_parallel_calls=2)
built = time.perf_counter() - t
client = reverb.TFClient(addr)
@tf.function
def sample():
    return client.sample(table, [tf.float32, tf.int32, tf.float32])
t = time.perf_counter()
sample.get_concrete_function()
print(built, time.perf_counter() - t)
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    runs = []
    deadline = time.perf_counter() + seconds
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "make_dataset.py")
        with open(script, "w") as f:
            f.write(code)
        while len(runs) < _least_runs(seconds) or time.perf_counter() < deadline and len(runs) < 7:
            out = subprocess.run(
                [sys.executable, script], capture_output=True, text=True, env=env, timeout=300
            )
            if out.returncode != 0:
                raise SystemExit(out.stderr[-2000:])
            built, traced = out.stdout.split()[-2:]
            runs.append((float(built), float(traced)))
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
    )


WORKLOADS = {
    "writer_small": writer_small,
    "writer_small_nosig": writer_small_nosig,
    "writer_frames": writer_frames,
    "writer_frames_nosig": writer_frames_nosig,
    "writer_strings": writer_strings,
    "legacy_writer": legacy_writer,
    "writer_batched": writer_batched,
    "writer_vector": writer_vector,
    "client_sample": client_sample,
    "prioritized": prioritized,
    "dataset_small": dataset_small,
    "dataset_frames": dataset_frames,
    "numpy_small": numpy_small,
    "numpy_frames": numpy_frames,
    "actors2": actors2,
    "actors4": actors4,
    "memory": memory,
    "memory_1m": memory_1m,
    "memory_frames": memory_frames,
    "latency_insert": latency_insert,
    "latency_sample": latency_sample,
    "append_only": append_only,
    "import_time": import_time,
    "dataset_setup": dataset_setup,
    "tfclient_trace": tfclient_trace,
}
OURS_ONLY = {"writer_batched", "writer_vector"}
# In bench/structured_workloads.py (imported only for them: it needs TensorFlow).
STRUCTURED = {"structured_small", "structured_frames", "pattern_dataset"}


def main() -> None:
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1")
        return
    if sys.argv[1] == "actor":
        _actor(sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5])
        os._exit(0)
    # (Several workloads, comma-separated, run one after the other in this process, each
    # with a setup of its own: for smoke runs; measurements take a process each.)
    workloads, mode, seconds = sys.argv[1].split(","), sys.argv[2], float(sys.argv[3])
    for workload in workloads:
        structured = workload in STRUCTURED
        if structured:
            import structured_workloads

            WORKLOADS.update(structured_workloads.WORKLOADS)
        setup = Setup(mode, structured=structured)
        try:
            result = WORKLOADS[workload](setup, seconds)
        finally:
            setup.close()
        print(json.dumps({"workload": workload, "mode": mode, **result}))
        sys.stdout.flush()
    os._exit(0)  # do not wait for servers' background threads


if __name__ == "__main__":
    main()
