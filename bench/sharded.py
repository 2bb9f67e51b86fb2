"""Scaling over shards: one client over N = 1, 2, 4 replay servers, each the bottleneck.

Each server runs in its own network namespace, joined to this one by a veth pair whose two
ends are shaped with `tc tbf` to `--mbit` Mbit/s, so every server has the same capacity (its
link) and the machine's two cores are not what limits. Measured, for each N:
- sampling: one `TrajectoryIterator` over the N addresses (the sharded sampler) drawing
  batches of `--item-kib` KiB items (random bytes, so compression does not help): samples/s
  and MB/s;
- writing: N writer processes (spawned, started at a common signal, timed from their first
  append to their last confirmation), each a `ShardedClient` trajectory writer whose episodes
  go to the shards in turn: steps/s and MB/s.
The target is >= 0.8 x N x the one-server numbers. Then, over 4 shards of different sizes
without shaping, the sampling distribution error: each shard's measured share of the samples
against its true share (uniform: size; prioritized: priority mass), and the total variation
distance between the measured item frequencies and the true global probabilities.

    python bench/sharded.py [--mbit 100] [--seconds 5] [--item-kib 64] [--markdown FILE]

Needs root (ip netns, ip link, tc), as the machines this project runs on give.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

import numpy as np

PORT = 8000
TABLE = "t"


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


class Shards:
    """N servers, each in namespace rvbbench<i> at 10.77.<i>.2, behind a shaped veth pair."""

    def __init__(self, n: int, mbit: float, tmp: str) -> None:
        self.n = n
        self.procs: List[subprocess.Popen] = []
        self.addresses = [f"10.77.{i}.2:{PORT}" for i in range(n)]
        config = {
            "port": PORT,
            "tables": [
                {
                    "name": TABLE,
                    "sampler": "uniform",
                    "remover": "fifo",
                    "max_size": 400,
                    "rate_limiter": {"min_size": 1},
                }
            ],
        }
        path = os.path.join(tmp, "shard.json")
        with open(path, "w") as f:
            json.dump(config, f)
        try:
            for i in range(n):
                self._link(i, mbit)
                self.procs.append(self._serve(i, path))
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _link(i: int, mbit: float) -> None:
        ns, host, peer = f"rvbbench{i}", f"rvbh{i}", f"rvbn{i}"
        # (What a run killed midway left: its namespace, and a host end not yet paired.)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", host], capture_output=True)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", ns)
        sh("ip", "addr", "add", f"10.77.{i}.1/24", "dev", host)
        sh("ip", "link", "set", host, "up")
        inside = ["ip", "netns", "exec", ns]
        sh(*inside, "ip", "addr", "add", f"10.77.{i}.2/24", "dev", peer)
        sh(*inside, "ip", "link", "set", peer, "up")
        sh(*inside, "ip", "link", "set", "lo", "up")
        shape = ["tbf", "rate", f"{mbit}mbit", "burst", "256kb", "latency", "50ms"]
        sh("tc", "qdisc", "add", "dev", host, "root", *shape)
        sh(*inside, "tc", "qdisc", "add", "dev", peer, "root", *shape)

    @staticmethod
    def _serve(i: int, config: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", f"rvbbench{i}", sys.executable, "-m", "reverb.server_main"]
            + ["--config", config],
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError(f"shard {i} exited early")
            if re.search(r"serving on port", line):
                return proc
        raise RuntimeError(f"shard {i} did not start")

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for i in range(self.n):
            subprocess.run(["ip", "netns", "del", f"rvbbench{i}"], capture_output=True)


def frame(item_bytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, item_bytes, dtype=np.uint8)


def fill(addresses: List[str], item_bytes: int, per_shard: int) -> None:
    import reverb

    for address in addresses:
        client = reverb.Client(address)
        with client.trajectory_writer(1) as writer:
            for i in range(per_shard):
                writer.append({"frame": frame(item_bytes, i)})
                writer.create_item(TABLE, 1.0, {"frame": writer.history["frame"][-1]})
            writer.flush(timeout_ms=120_000)


def sample_rate(addresses: List[str], seconds: float) -> float:
    """Samples/s of one sharded sampler, after a warm-up."""
    import reverb

    with reverb.TrajectoryIterator(
        addresses, TABLE, batch_size=8, max_in_flight_samples_per_worker=16
    ) as it:
        warm = time.monotonic() + 1.0
        while time.monotonic() < warm:
            next(it)
        count, begin = 0, time.monotonic()
        while time.monotonic() - begin < seconds:
            count += len(next(it).info.key)
        return count / (time.monotonic() - begin)


def writer_main(addresses: List[str], item_bytes: int, seconds: float, go, out) -> None:
    import reverb

    client = reverb.ShardedClient(addresses)
    data = frame(item_bytes, os.getpid())
    go.wait()
    steps, begin = 0, time.monotonic()
    with client.trajectory_writer(1) as writer:
        while time.monotonic() - begin < seconds:
            writer.append({"frame": data})
            writer.create_item(TABLE, 1.0, {"frame": writer.history["frame"][-1]})
            steps += 1
            if steps % 10 == 0:
                writer.end_episode()
        writer.end_episode(timeout_ms=120_000)
    out.put(steps / (time.monotonic() - begin))


def write_rate(addresses: List[str], item_bytes: int, seconds: float) -> float:
    """Steps/s of len(addresses) writer processes, in total."""
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=writer_main, args=(addresses, item_bytes, seconds, go, out))
        for _ in addresses
    ]
    for p in procs:
        p.start()
    time.sleep(3.0)  # imports done
    go.set()
    rates = [out.get(timeout=seconds + 180) for _ in procs]
    for p in procs:
        p.join(60)
    return sum(rates)


def distribution_error(samples: int) -> List[Tuple[str, float, float, float, float]]:
    """(table kind, max |measured - true| shard share, 5-sigma bound of it, total variation
    distance of the item frequencies, and that distance exact sampling would show on
    average) over 4 in-process shards of sizes 50..400."""
    import reverb

    rows = []
    for kind, sampler in (
        ("uniform", reverb.selectors.Uniform()),
        ("prioritized (α=0.8)", reverb.selectors.Prioritized(0.8)),
    ):
        servers = [
            reverb.Server(
                [
                    reverb.Table(
                        TABLE,
                        sampler,
                        reverb.selectors.Fifo(),
                        10_000,
                        reverb.rate_limiters.MinSize(1),
                    )
                ]
            )
            for _ in range(4)
        ]
        try:
            addresses = [f"localhost:{s.port}" for s in servers]
            weights: Dict[int, float] = {}
            shard_of: Dict[int, int] = {}
            rng = np.random.default_rng(1)
            for shard, size in enumerate((50, 100, 200, 400)):
                client = reverb.Client(addresses[shard])
                for i in range(size):
                    value = shard * 1000 + i
                    priority = float(rng.uniform(0.1, 10.0))
                    client.insert(np.int64(value), {TABLE: priority})
                    weights[value] = priority**0.8 if "prior" in kind else 1.0
                    shard_of[value] = shard
            total = sum(weights.values())
            counts: Dict[int, int] = {}
            with reverb.TrajectoryIterator(addresses, TABLE, batch_size=500) as it:
                for _ in range(samples // 500):
                    for v in next(it).data[0].ravel().tolist():
                        counts[v] = counts.get(v, 0) + 1
            shares = [
                sum(w for v, w in weights.items() if shard_of[v] == s) / total for s in range(4)
            ]
            measured = [
                sum(c for v, c in counts.items() if shard_of[v] == s) / samples for s in range(4)
            ]
            error = max(abs(m - t) for m, t in zip(measured, shares))
            bound = max(5 * np.sqrt(t * (1 - t) / samples) for t in shares)
            tv = 0.5 * sum(abs(counts.get(v, 0) / samples - w / total) for v, w in weights.items())
            # What exact sampling would show on average: E|X/n - p| ~ sqrt(2p(1-p)/(pi n)).
            noise = 0.5 * sum(
                np.sqrt(2 * (w / total) * (1 - w / total) / (np.pi * samples))
                for w in weights.values()
            )
            rows.append((kind, error, bound, tv, noise))
        finally:
            for server in servers:
                server.stop()
    return rows


def rate_limited_ratio(seconds: float) -> Tuple[List[float], List[float], float]:
    """4 in-process shards with SampleToInsertRatio(2, min_size=20, error_buffer=40) each,
    4 writer processes spreading episodes over them and one sharded sampler draining them
    for `seconds`: samples per insert (server counters) globally then per shard, as the
    writers finish and once the sampler has taken all the limiters allow; and inserts/s."""
    import threading

    import reverb

    servers = [
        reverb.Server(
            [
                reverb.Table(
                    TABLE,
                    reverb.selectors.Uniform(),
                    reverb.selectors.Fifo(),
                    10_000,
                    reverb.rate_limiters.SampleToInsertRatio(2.0, 20, 40.0),
                )
            ]
        )
        for _ in range(4)
    ]
    try:
        addresses = [f"localhost:{s.port}" for s in servers]
        client = reverb.ShardedClient(addresses)
        stop = threading.Event()

        def sample() -> None:
            with reverb.TrajectoryIterator(
                addresses, TABLE, batch_size=16, rate_limiter_timeout_ms=10_000
            ) as it:
                for _ in it:
                    if stop.is_set():
                        return

        def ratios() -> Tuple[List[float], int]:
            counts = []
            for info in client.shard_info(timeout=10):
                limiter = info[TABLE].rate_limiter_info
                counts.append((limiter.insert_stats.completed, limiter.sample_stats.completed))
            inserts = sum(i for i, _ in counts)
            samples = sum(s for _, s in counts)
            return [samples / inserts] + [s / i for i, s in counts], inserts

        sampler = threading.Thread(target=sample)
        sampler.start()
        begin = time.monotonic()
        write_rate(addresses, 64, seconds)
        elapsed = time.monotonic() - begin
        during, inserts = ratios()
        sampler.join(60)  # (ends 10 s after the limiters last allowed a sample)
        stop.set()
        after, _ = ratios()
        return during, after, inserts / elapsed
    finally:
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mbit", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--item-kib", type=int, default=64)
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--distribution-samples", type=int, default=200_000)
    parser.add_argument("--markdown", help="also write the tables to this file")
    args = parser.parse_args()
    item_bytes = args.item_kib * 1024
    lines = [
        f"Per-server link: {args.mbit:g} Mbit/s each way (tc tbf on a veth pair into the "
        f"server's namespace); items of {args.item_kib} KiB random bytes; {args.seconds:g} s "
        "per measurement.",
        "",
        "| Shards | Sampling samples/s | MB/s | × one shard | Writing steps/s (N writers) "
        "| MB/s | × one shard |",
        "|---|---|---|---|---|---|---|",
    ]
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in args.shards.split(",")]:
            shards = Shards(n, args.mbit, tmp)
            try:
                fill(shards.addresses, item_bytes, 100)
                sampled = sample_rate(shards.addresses, args.seconds)
                written = write_rate(shards.addresses, item_bytes, args.seconds)
            finally:
                shards.close()
            base = base or (sampled, written)
            mb = item_bytes / 1e6
            lines.append(
                f"| {n} | {sampled:,.0f} | {sampled * mb:.1f} | {sampled / base[0]:.2f} "
                f"| {written:,.0f} | {written * mb:.1f} | {written / base[1]:.2f} |"
            )
            print(lines[-1], flush=True)
    lines += [
        "",
        f"Sampling distribution over 4 shards of 50, 100, 200 and 400 items "
        f"({args.distribution_samples:,} samples through one sharded TrajectoryIterator):",
        "",
        "| Table | Max shard share error | 5σ bound | Total variation distance (items) "
        "| Same, exact sampling (expected) |",
        "|---|---|---|---|---|",
    ]
    for kind, error, bound, tv, noise in distribution_error(args.distribution_samples):
        lines.append(f"| {kind} | {error:.4f} | {bound:.4f} | {tv:.4f} | {noise:.4f} |")
        print(lines[-1], flush=True)
    during, after, inserts = rate_limited_ratio(args.seconds)
    lines += [
        "",
        "Rate limiting: 4 shards each with SampleToInsertRatio(2.0, min_size=20, "
        "error_buffer=40), 4 writer processes spreading episodes over them "
        f"({inserts:,.0f} inserts/s in all), one sharded sampler as fast as it can. Samples "
        "per insert, globally and on each shard:",
        "",
        "| When | Global | Shard 0 | Shard 1 | Shard 2 | Shard 3 |",
        "|---|---|---|---|---|---|",
        "| as the writers finish | " + " | ".join(f"{r:.3f}" for r in during) + " |",
        "| once the sampler took all it may | " + " | ".join(f"{r:.3f}" for r in after) + " |",
    ]
    print(lines[-1], flush=True)
    text = "\n".join(lines)
    print("\n" + text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
