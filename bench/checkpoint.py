"""Checkpoint and restore throughput of ~1 GB of stored chunks, and the pause concurrent
writers see while a checkpoint is written. With `--storage DIR`, the server keeps its chunks
on disk in DIR (a 64 MiB cache) and the restore goes into a disk-backed server too.

    python bench/checkpoint.py [--gigabytes 1.0] [--dir /tmp/reverb-ckpt-bench]
        [--storage DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading
import time

import numpy as np

import reverb


def tables() -> list:
    return [
        reverb.Table(
            "big",
            reverb.selectors.Uniform(),
            reverb.selectors.Fifo(),
            1_000_000,
            reverb.rate_limiters.MinSize(1),
        ),
        reverb.Table(
            "small",
            reverb.selectors.Uniform(),
            reverb.selectors.Fifo(),
            1_000_000,
            reverb.rate_limiters.MinSize(1),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--dir", default="/tmp/reverb-ckpt-bench")
    parser.add_argument("--storage", default=None, help="keep chunks on disk in this directory")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)

    def storage(suffix: str) -> reverb.DiskStorage | None:
        if args.storage is None:
            return None
        shutil.rmtree(args.storage + suffix, ignore_errors=True)
        return reverb.DiskStorage(args.storage + suffix, cache_bytes=64 << 20)

    checkpointer = reverb.checkpointers.DefaultCheckpointer(args.dir)
    server = reverb.Server(tables(), checkpointer=checkpointer, storage=storage(""))
    client = server.localhost_client()
    rng = np.random.default_rng(0)
    block = rng.integers(0, 255, 1 << 20, dtype=np.uint8)  # 1 MiB, incompressible
    n = int(args.gigabytes * 1024)
    with client.trajectory_writer(1) as writer:
        for i in range(n):
            block[:8] = np.frombuffer(np.int64(i).tobytes(), np.uint8)  # distinct chunks
            writer.append({"frame": block})
            writer.create_item("big", 1.0, writer.history["frame"][-1])
    stored = n * (1 << 20)

    # Throughput: a checkpoint with nothing else running.
    start = time.perf_counter()
    client.checkpoint()
    quiet_save = time.perf_counter() - start

    # A concurrent writer of small items measures how long inserts pause.
    latencies: list = []
    stop = threading.Event()

    def small_writer() -> None:
        c = reverb.Client(f"localhost:{server.port}")
        while not stop.is_set():
            t = time.perf_counter()
            c.insert(np.zeros(8, np.float32), {"small": 1.0})
            latencies.append(time.perf_counter() - t)

    thread = threading.Thread(target=small_writer)
    thread.start()
    time.sleep(0.5)
    baseline = sorted(latencies)
    latencies.clear()
    start = time.perf_counter()
    path = client.checkpoint()
    save = time.perf_counter() - start
    stop.set()
    thread.join()
    size = os.path.getsize(os.path.join(path, "checkpoint.rvb"))
    linked = (
        sum(e.stat().st_size for e in os.scandir(os.path.join(path, "segments")))
        if (os.path.isdir(os.path.join(path, "segments")))
        else 0
    )
    server.stop()

    start = time.perf_counter()
    restored = reverb.Server(tables(), checkpointer=checkpointer, storage=storage("-restored"))
    load = time.perf_counter() - start
    assert restored.localhost_client().server_info()["big"].current_size == n
    restored.stop()
    shutil.rmtree(args.dir, ignore_errors=True)
    for suffix in ("", "-restored"):
        if args.storage is not None:
            shutil.rmtree(args.storage + suffix, ignore_errors=True)

    p50 = baseline[len(baseline) // 2] * 1e3 if baseline else float("nan")
    worst = max(latencies) * 1e3 if latencies else float("nan")
    print(
        f"stored chunk data: {stored / 1e9:.2f} GB; checkpoint file {size / 1e9:.3f} GB, "
        f"linked segments {linked / 1e9:.2f} GB"
    )
    print(
        f"checkpoint: {quiet_save:.2f} s = {stored / quiet_save / 1e6:,.0f} MB/s (including "
        f"fsync); with a concurrent writer: {save:.2f} s = {stored / save / 1e6:,.0f} MB/s"
    )
    print(f"restore:    {load:.2f} s = {stored / load / 1e6:,.0f} MB/s")
    print(
        f"concurrent small inserts during the checkpoint: {len(latencies)} completed, worst "
        f"{worst:.1f} ms (p50 before: {p50:.2f} ms)"
    )
    os._exit(0)


if __name__ == "__main__":
    main()
