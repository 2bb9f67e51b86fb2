"""Cost that stays flat as a table grows: a table filled to 10M small 2-step items (uniform,
then prioritized, each on a fresh server in another process), measured at 100k, 1M and 10M
items against a table held at 100k in the same server, in interleaved slices (the VM's speed
drifts by tens of percent within minutes, so levels measured minutes apart do not compare).

    python bench/scale.py [--levels 100000,1000000,10000000] [--markdown FILE]

How: the server has two tables of small 2-step items with a signature (obs float32[2, 8],
action int32[2], reward float32[2]) and a FIFO remover: `big`, with room for the largest
level, and `base`, holding the smallest level (full, so each insert also evicts one).
`--actors` actor processes write through `Client.trajectory_writer` (validation on, episodes of
1000 steps; random priorities). When `big` reaches a level (the last `3 x --slice` items of
it written in the slices below):
- insert: three rounds of `--slice` items into `big`, then `--slice` into `base`, each timed
  from the command to the last actor's confirmed flush (items/s, all actors; the median round);
- sample: `Client.sample(table, 256)` here, alternating tables every 0.25 s for `--seconds`
  each (samples/s);
- latency: `Client.sample(table, 1)` round trips here, alternating tables (p50 and p99, us);
- memory: the growth of the server's RSS since `base` was filled, per item of `big`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Callable, List, Optional

import numpy as np
from workloads import rss, wait_for_address

import reverb

BIG, BASE = "big", "base"
EPISODE = 1000


def serve(port_file: str, kind: str, big: int, base: int) -> None:
    """The server process: the two tables."""
    import tensorflow as tf

    def table(name: str, max_size: int) -> reverb.Table:
        if kind == "prioritized":
            sampler = reverb.selectors.Prioritized(0.6)
        else:
            sampler = reverb.selectors.Uniform()
        return reverb.Table(
            name=name,
            sampler=sampler,
            remover=reverb.selectors.Fifo(),
            max_size=max_size,
            rate_limiter=reverb.rate_limiters.MinSize(1),
            signature={
                "obs": tf.TensorSpec([2, 8], tf.float32),
                "action": tf.TensorSpec([2], tf.int32),
                "reward": tf.TensorSpec([2], tf.float32),
            },
        )

    server = reverb.Server([table(BIG, big), table(BASE, base)])
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.port))
    os.rename(port_file + ".tmp", port_file)
    server.wait()


def actor(address: str, seed: int) -> None:
    """An actor process: for each line `table count` read from stdin, writes that many items
    to the table, flushes, and answers `done` on stdout."""
    client = reverb.Client(address)
    rng = np.random.default_rng(seed)
    priorities = (rng.random(100_000) + 1e-3).tolist()
    obs = np.zeros(8, np.float32)
    t = 0
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for line in sys.stdin:
            table, count = line.split()
            written = 0
            while written < int(count):
                writer.append({"obs": obs, "action": np.int32(t), "reward": np.float32(1.0)})
                t += 1
                if writer.episode_steps >= 2:
                    h = writer.history
                    trajectory = {k: h[k][-2:] for k in ("obs", "action", "reward")}
                    writer.create_item(table, priorities[t % len(priorities)], trajectory)
                    written += 1
                if writer.episode_steps >= EPISODE:
                    writer.end_episode(timeout_ms=60_000)
            writer.flush(timeout_ms=60_000)
            print("done", flush=True)


class Run:
    """A server process and its actor processes."""

    def __init__(self, kind: str, big: int, base: int, actors: int) -> None:
        port_file = f"/tmp/reverb-scale-port-{os.getpid()}"
        self.server = subprocess.Popen(
            [sys.executable, __file__, "serve", port_file, kind, str(big), str(base)],
            stdout=subprocess.DEVNULL,
        )
        self.address = wait_for_address(self.server, port_file, 120)
        self.actors = [
            subprocess.Popen(
                [sys.executable, __file__, "actor", self.address, str(i)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(actors)
        ]

    def write(self, table: str, items: int) -> float:
        """The actors write `items` to `table` in all; returns the seconds it took."""
        share = [items // len(self.actors)] * len(self.actors)
        share[0] += items - sum(share)
        start = time.perf_counter()
        for proc, n in zip(self.actors, share):
            proc.stdin.write(f"{table} {n}\n")
            proc.stdin.flush()
        for proc in self.actors:
            if proc.stdout.readline().strip() != "done":
                raise RuntimeError("an actor failed")
        return time.perf_counter() - start

    def close(self) -> None:
        for proc in self.actors:
            proc.stdin.close()
            proc.wait(60)
        self.server.kill()
        self.server.wait()


def _alternate(seconds: float, step: Callable[[str], int]) -> dict:
    """Runs `step(table)` (returning a count) on the two tables in turns of 0.25 s until each
    had `seconds`; the count per second of each."""
    counts = {BIG: 0, BASE: 0}
    spent = {BIG: 0.0, BASE: 0.0}
    while min(spent.values()) < seconds:
        for table in (BIG, BASE):
            start = time.perf_counter()
            while time.perf_counter() - start < 0.25:
                counts[table] += step(table)
            spent[table] += time.perf_counter() - start
    return {table: counts[table] / spent[table] for table in counts}


def _one_sample(client: reverb.Client, table: str, times: list) -> int:
    """One `Client.sample(table, 1)` round trip, its time appended to `times`."""
    start = time.perf_counter()
    next(client.sample(table, 1, emit_timesteps=False))
    times.append(time.perf_counter() - start)
    return 1


def measure(kind: str, levels: List[int], slice_: int, actors: int, seconds: float) -> list:
    """One sampler kind: `big` filled level by level; a row per level."""
    run = Run(kind, levels[-1], levels[0], actors)
    rows = []
    try:
        client = reverb.Client(run.address)
        run.write(BASE, levels[0])
        time.sleep(0.5)
        base_rss = rss(run.server.pid)
        written = 0
        for level in levels:
            run.write(BIG, level - 3 * slice_ - written)
            rounds = []
            for _ in range(3):
                rounds.append((slice_ / run.write(BIG, slice_), slice_ / run.write(BASE, slice_)))
            written = level
            info = client.server_info(timeout=60)
            assert info[BIG].current_size == level, (info[BIG].current_size, level)
            assert info[BASE].current_size == levels[0], (info[BASE].current_size, levels[0])
            held = rss(run.server.pid)
            rates = _alternate(
                seconds, lambda t: sum(1 for _ in client.sample(t, 256, emit_timesteps=False))
            )
            times: dict = {BIG: [], BASE: []}
            _alternate(seconds, lambda t, times=times: _one_sample(client, t, times[t]))
            for values in times.values():
                values.sort()
            p = {t: (v[len(v) // 2] * 1e6, v[int(len(v) * 0.99)] * 1e6) for t, v in times.items()}
            rows.append(
                {
                    "table": kind,
                    "items": level,
                    "insert_items_per_s": sorted(r[0] for r in rounds)[1],
                    "base_insert_items_per_s": sorted(r[1] for r in rounds)[1],
                    "samples_per_s": rates[BIG],
                    "base_samples_per_s": rates[BASE],
                    "sample_p50_us": p[BIG][0],
                    "sample_p99_us": p[BIG][1],
                    "base_sample_p50_us": p[BASE][0],
                    "bytes_per_item": (held - base_rss) / level,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        run.close()
    return rows


def markdown(rows: list, base: int, command: str) -> str:
    out = [
        f"    {command}",
        "",
        f"`base` is a table held at {base:,} items in the same server, measured in slices "
        "interleaved with the level's. \"x first\" is the level's rate over the first level's, "
        "each taken relative to `base` at the time (so the VM's drift between levels cancels, "
        "and so does `base` evicting on each insert).",
        "",
        "| table | items | insert (items/s) | base | x first | Client.sample(256) (samples/s) "
        "| base | x first | sample p50 / p99 (us) | base p50 (us) | server RSS per item |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        first = next(f for f in rows if f["table"] == r["table"])

        def relative(key: str, r: dict = r, first: dict = first) -> float:
            return (r[key] / r["base_" + key]) / (first[key] / first["base_" + key])

        out.append(
            f"| {r['table']} | {r['items']:,} | {r['insert_items_per_s']:,.0f} "
            f"| {r['base_insert_items_per_s']:,.0f} | {relative('insert_items_per_s'):.2f}x "
            f"| {r['samples_per_s']:,.0f} | {r['base_samples_per_s']:,.0f} "
            f"| {relative('samples_per_s'):.2f}x "
            f"| {r['sample_p50_us']:.0f} / {r['sample_p99_us']:.0f} "
            f"| {r['base_sample_p50_us']:.0f} | {r['bytes_per_item']:,.0f} B |"
        )
    return "\n".join(out) + "\n"


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="100000,1000000,10000000")
    parser.add_argument("--slice", type=int, default=30_000, help="items per timed insert slice")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=2.0, help="per table, per measure")
    parser.add_argument("--tables", default="uniform,prioritized")
    parser.add_argument("--markdown", help="also write the table to this file")
    args = parser.parse_args(argv)
    levels = sorted(int(x) for x in args.levels.split(","))
    if levels[0] < 3 * args.slice:
        parser.error("the smallest level must hold three slices")
    rows = []
    for kind in args.tables.split(","):
        rows += measure(kind, levels, args.slice, args.actors, args.seconds)
    command = "python bench/scale.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = markdown(rows, levels[0], command.strip())
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    elif len(sys.argv) > 1 and sys.argv[1] == "actor":
        actor(sys.argv[2], int(sys.argv[3]))
    else:
        main()
