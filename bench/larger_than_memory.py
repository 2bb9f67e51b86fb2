"""Tables on disk (issue 43), side by side with dm-reverb 0.14.0 in memory: a table of 84x84
uint8 frames (incompressible, an item per step, episodes of 1000 steps) written by an actor
process through a trajectory writer into a table with a signature, then sampled by a learner
process in batches of 32 (`TrajectoryDataset(...).batch(32)`), the server in a third
process. Rows:

- `reference`: dm-reverb 0.14.0 (its own virtualenv), everything in memory;
- `memory`: ours, everything in memory;
- `disk, cached`: ours on disk with a cache larger than the table;
- `disk, 10x cache`: ours on disk, the table ten times its cache;
- `... under LIMIT`: the server process in a memory cgroup of LIMIT (cgroup v1 or v2, needs
  root), the table several times LIMIT: ours on disk, and the reference (which cannot hold
  it: reported as killed when the kernel kills it).

Reported per row: frames written per second (until confirmed), frames sampled per second,
the server's peak resident memory and the bytes its directory takes.

    python bench/larger_than_memory.py [--reference-python PATH] [--frames 20000]
        [--big-frames 600000] [--limit-mb 1536] [--cache-mb 256] [--seconds 5]
        [--markdown FILE]

    python bench/larger_than_memory.py serve PORT_FILE FRAMES [DIR CACHE_BYTES]
    python bench/larger_than_memory.py write ADDRESS FRAMES
    python bench/larger_than_memory.py sample ADDRESS SECONDS
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional

FRAME = (84, 84)
FRAME_BYTES = FRAME[0] * FRAME[1]
EPISODE = 1000
HERE = os.path.abspath(__file__)


def _spec():
    import tensorflow as tf

    return {"frame": tf.TensorSpec(FRAME, tf.uint8)}


def serve(port_file: str, frames: int, directory: Optional[str], cache_bytes: int) -> None:
    import reverb

    table = reverb.Table(
        "frames",
        reverb.selectors.Uniform(),
        reverb.selectors.Fifo(),
        frames,
        reverb.rate_limiters.MinSize(1),
        signature=_spec(),
    )
    kwargs = {}
    if directory:
        kwargs["storage"] = reverb.DiskStorage(directory, cache_bytes=cache_bytes)
    server = reverb.Server([table], **kwargs)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.port))
    os.rename(port_file + ".tmp", port_file)
    server.wait()


def write(address: str, frames: int) -> None:
    import numpy as np

    import reverb

    rng = np.random.default_rng(0)
    base = [rng.integers(0, 256, FRAME, dtype=np.uint8) for _ in range(256)]
    client = reverb.Client(address)
    started = time.perf_counter()
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for step in range(frames):
            writer.append({"frame": base[step % 256] ^ np.uint8(step // 256 % 251)})
            writer.create_item("frames", 1.0, {"frame": writer.history["frame"][-1]})
            if step % EPISODE == EPISODE - 1:
                writer.end_episode()
        writer.flush()
    print(json.dumps({"write": frames / (time.perf_counter() - started)}), flush=True)


def sample(address: str, seconds: float) -> None:
    import tensorflow as tf

    import reverb

    dataset = reverb.TrajectoryDataset(
        server_address=address,
        table="frames",
        dtypes={"frame": tf.uint8},
        shapes={"frame": tf.TensorShape(FRAME)},
        max_in_flight_samples_per_worker=64,
    ).batch(32)
    it = iter(dataset)
    for _ in range(10):
        next(it)
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        next(it)
        n += 32
    print(json.dumps({"sample": n / (time.perf_counter() - started)}), flush=True)


class Cgroup:
    """A memory cgroup of `limit` bytes (v2 if mounted so, else v1), removed on close."""

    def __init__(self, limit: int) -> None:
        v2 = "/sys/fs/cgroup/cgroup.controllers"
        name = f"reverb-bench-{os.getpid()}"
        if os.path.exists(v2):
            self.path = f"/sys/fs/cgroup/{name}"
            os.mkdir(self.path)
            self._write("memory.max", str(limit))
            self._write("memory.swap.max", "0")
        else:
            self.path = f"/sys/fs/cgroup/memory/{name}"
            os.mkdir(self.path)
            self._write("memory.limit_in_bytes", str(limit))

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))

    def close(self) -> None:
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.1)


def memory(pid: int, field: str) -> int:
    """`field` (VmRSS: now, VmHWM: peak) of process `pid`, in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def disk_bytes(directory: Optional[str]) -> int:
    if not directory:
        return 0
    return sum(
        os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(directory)
        for f in files
    )


def run_row(
    python: str,
    frames: int,
    seconds: float,
    directory: Optional[str] = None,
    cache_bytes: int = 0,
    limit: Optional[int] = None,
) -> dict:
    """One row: a server process (in a cgroup of `limit` bytes if given), a writer process,
    then a sampler process."""
    port_file = tempfile.mktemp(prefix="reverb-ltm-port-")
    args = [python, HERE, "serve", port_file, str(frames)]
    if directory:
        args += [directory, str(cache_bytes)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    if python != sys.executable:
        env.pop("PYTHONPATH", None)  # the reference's interpreter must not find ours
    cgroup = Cgroup(limit) if limit else None
    server = subprocess.Popen(args, env=env, stderr=subprocess.DEVNULL)
    row: dict = {}
    try:
        if cgroup:
            cgroup.add(server.pid)
        # (Imported here: the subcommands run under the reference's interpreter too, which
        # must not import ours through `workloads`.)
        from workloads import wait_for_address

        address = wait_for_address(server, port_file, 120)
        # (The server's interpreter with TensorFlow, for the tables' signatures, and the
        # server running, before any data: what the data adds is the peak above it.)
        row["rss_before"] = memory(server.pid, "VmRSS")
        for step, extra in (("write", [str(frames)]), ("sample", [str(seconds)])):
            # (Its output goes to files: a pipe nobody reads while it runs could fill.)
            out_file, err_file = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            client = subprocess.Popen(
                [python, HERE, step, address, *extra],
                env=env,
                stdout=out_file,
                stderr=err_file,
                text=True,
            )
            # (A client of a server that died may wait for it for long: it is stopped.)
            while client.poll() is None and server.poll() is None:
                time.sleep(0.1)
            if server.poll() is not None:
                client.kill()
                client.wait()
                row["killed"] = f"the server died (exit {server.returncode}) during {step}"
                break
            client.wait()
            out_file.seek(0)
            err_file.seek(0)
            out, err = out_file.read(), err_file.read()
            if client.returncode != 0:
                raise RuntimeError(f"{step} failed: {err[-2000:]}")
            row.update(json.loads(out.strip().splitlines()[-1]))
        if server.poll() is None:
            row["peak_rss"] = memory(server.pid, "VmHWM")
            row["rss_end"] = memory(server.pid, "VmRSS")
        row["disk"] = disk_bytes(directory)
    finally:
        server.kill()
        server.wait()
        if cgroup:
            cgroup.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--reference-python",
        default=os.path.expanduser("~/.cache/reverb-reference-venv/bin/python"),
    )
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--big-frames", type=int, default=600_000)
    parser.add_argument("--limit-mb", type=int, default=1536)
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--markdown")
    parser.add_argument("--rows", default="reference,memory,cached,tenth,limit")
    args = parser.parse_args()
    ours, ref = sys.executable, args.reference_python
    data = args.frames * FRAME_BYTES
    limit = args.limit_mb << 20
    rows = []
    work = tempfile.mkdtemp(prefix="reverb-ltm-", dir="/var/tmp")
    wanted = set(args.rows.split(","))
    try:
        plan = [
            (
                "reference",
                "dm-reverb 0.14.0, memory",
                args.reference_python,
                args.frames,
                None,
                0,
                None,
            ),
            ("memory", "ours, memory", ours, args.frames, None, 0, None),
            ("cached", "ours, disk, cache > table", ours, args.frames, "a", 2 * data, None),
            ("tenth", "ours, disk, table = 10x cache", ours, args.frames, "b", data // 10, None),
            (
                "limit",
                f"ours, disk, {args.big_frames * FRAME_BYTES >> 20} MiB table, "
                f"cache {args.cache_mb} MiB, server under {args.limit_mb} MiB",
                ours,
                args.big_frames,
                "c",
                args.cache_mb << 20,
                limit,
            ),
            (
                "limit",
                f"dm-reverb 0.14.0, memory, the same table under {args.limit_mb} MiB",
                ref,
                args.big_frames,
                None,
                0,
                limit,
            ),
        ]
        for key, name, python, frames, sub, cache, cg in plan:
            if key not in wanted:
                continue
            directory = os.path.join(work, sub) if sub else None
            row = run_row(python, frames, args.seconds, directory, cache, cg)
            row["name"] = name
            rows.append(row)
            print(json.dumps(row), flush=True)
            if directory:
                shutil.rmtree(directory, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [
        "| setting | writes (frames/s) | samples (frames/s, batches of 32) | server RSS: "
        "idle before, peak, after sampling | disk |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        fmt = {k: f"{r[k]:,.0f}" if k in r else "—" for k in ("write", "sample")}
        lines.append(
            f"| {r['name']} | {fmt['write']} | {fmt['sample']} | "
            + (
                f"{r['rss_before'] / 2**20:,.0f} / {r['peak_rss'] / 2**20:,.0f} / "
                f"{r['rss_end'] / 2**20:,.0f} MiB"
                if "peak_rss" in r
                else r.get("killed", "—")
            )
            + f" | {r['disk'] / 2**20:,.0f} MiB |"
        )
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(
            sys.argv[2],
            int(sys.argv[3]),
            sys.argv[4] if len(sys.argv) > 4 else None,
            int(sys.argv[5]) if len(sys.argv) > 5 else 0,
        )
    elif len(sys.argv) > 1 and sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "sample":
        sample(sys.argv[2], float(sys.argv[3]))
    else:
        main()
