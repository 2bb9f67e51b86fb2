"""Soak benchmark: a server in its own process under 4 writer processes and 2 sampler
processes for a while; prints the server's RSS over time and whether it stayed flat once the
table was full (it must: a full table drops an item for every one it takes, and the chunks
of dropped items must be freed).

    python bench/soak.py [--seconds 180] [--interval 10] [--max-size 200000]
                         [--python PYTHON]   # e.g. the reference's virtualenv, to compare

Writers append small steps (obs float32[8], action int32, reward float32) to a table with a
signature (writers validate, the default), make 2-step items and end their episodes every
100 steps; samplers draw batches of 64. Uses only the API both packages share.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

TABLE = "soak"
HERE = os.path.abspath(__file__)


def _tables(max_size: int) -> list:
    import reverb

    try:
        import tensorflow as tf

        signature = {
            "obs": tf.TensorSpec([2, 8], tf.float32),
            "action": tf.TensorSpec([2], tf.int32),
            "reward": tf.TensorSpec([2], tf.float32),
        }
    except ImportError:  # ours without TensorFlow: no signature (the reference needs TF)
        signature = None
    return [
        reverb.Table(
            name=TABLE,
            sampler=reverb.selectors.Uniform(),
            remover=reverb.selectors.Fifo(),
            max_size=max_size,
            rate_limiter=reverb.rate_limiters.MinSize(1000),
            signature=signature,
        )
    ]


def serve(port_file: str, max_size: int) -> None:
    import reverb

    server = reverb.Server(_tables(max_size))
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.port))
    os.rename(port_file + ".tmp", port_file)
    server.wait()


def write(address: str, stop_file: str) -> None:
    import numpy as np

    import reverb

    client = reverb.Client(address)
    step = 0
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        while not os.path.exists(stop_file):
            for _ in range(100):
                writer.append(
                    {
                        "obs": np.full(8, step, np.float32),
                        "action": np.int32(step),
                        "reward": np.float32(1.0),
                    }
                )
                if writer.episode_steps >= 2:
                    writer.create_item(
                        TABLE,
                        1.0,
                        {k: v[-2:] for k, v in writer.history.items()},
                    )
                step += 1
            writer.end_episode(timeout_ms=60_000)


def sample(address: str, stop_file: str, out: str) -> None:
    import reverb

    client = reverb.Client(address)
    n = 0
    while not os.path.exists(stop_file):
        try:
            n += sum(1 for _ in client.sample(TABLE, 64, emit_timesteps=False))
        except Exception:  # noqa: BLE001 - the table may not have min_size items yet
            time.sleep(0.05)
    with open(out, "w") as f:
        f.write(str(n))


def monitor(address: str, server_pid: int, interval: float) -> None:
    """Prints the table's size, its insert count and the server's RSS every `interval`
    seconds, one JSON line each (a child process, so the benchmark's own process imports
    neither package)."""
    from workloads import rss

    import reverb

    client = reverb.Client(address)
    while True:
        time.sleep(interval)
        info = client.server_info(timeout=30)[TABLE]
        inserted = info.rate_limiter_info.insert_stats.completed
        print(json.dumps([info.current_size, inserted, rss(server_pid)]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--interval", type=float, default=10)
    parser.add_argument("--max-size", type=int, default=200_000)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    tag = f"/tmp/reverb-soak-{os.getpid()}"
    port_file, stop_file = tag + "-port", tag + "-stop"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    logs: dict = {}

    def spawn(name: str, *argv: str, **kwargs: object) -> subprocess.Popen:
        # Each child's stderr goes to a file, shown if it exits early.
        logs[name] = open(f"{tag}-{name}.err", "w+")
        kwargs.setdefault("stdout", subprocess.DEVNULL)
        return subprocess.Popen(
            [args.python, HERE, *argv], stderr=logs[name], env=env, text=True, **kwargs
        )

    server = spawn("server", "serve", port_file, str(args.max_size))
    children = []
    try:
        deadline = time.time() + 120
        while not os.path.exists(port_file):
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit("the soak server did not start")
            time.sleep(0.1)
        with open(port_file) as f:
            address = f"localhost:{f.read().strip()}"
        writers = [spawn(f"writer{i}", "write", address, stop_file) for i in range(4)]
        outs = [f"{tag}-samples-{i}" for i in range(2)]
        samplers = [
            spawn(f"sampler{i}", "sample", address, stop_file, out) for i, out in enumerate(outs)
        ]
        watch = spawn(
            "monitor",
            "monitor",
            address,
            str(server.pid),
            str(args.interval),
            stdout=subprocess.PIPE,
        )
        children = [server] + writers + samplers + [watch]
        print(f"# {args.python}: 4 writers, 2 samplers, max_size {args.max_size}")
        print(f"{'t (s)':>6} {'items':>8} {'inserted':>10} {'server RSS (MiB)':>17}")
        start = time.time()
        rows = []
        while time.time() - start < args.seconds:
            line = watch.stdout.readline()
            if not line or any(p.poll() is not None for p in children):
                for name, log in logs.items():
                    log.seek(0)
                    tail = log.read()[-1500:].strip()
                    if tail:
                        print(f"--- {name} stderr:\n{tail}", file=sys.stderr)
                raise SystemExit("the server, a writer, a sampler or the monitor exited early")
            size, inserted, rss = json.loads(line)
            row = (time.time() - start, size, inserted, rss)
            rows.append(row)
            print(f"{row[0]:6.0f} {row[1]:8d} {row[2]:10d} {row[3] / 2**20:17.1f}", flush=True)
        open(stop_file, "w").close()
        watch.kill()
        for p in writers + samplers:
            p.wait(120)
        sampled = 0
        for out in outs:
            with open(out) as f:
                sampled += int(f.read())
            os.remove(out)
        full = [r for r in rows if r[1] >= args.max_size]
        elapsed = rows[-1][0]
        print(
            f"inserts/s {rows[-1][2] / elapsed:,.0f}, samples/s {sampled / elapsed:,.0f} "
            "(all processes)"
        )
        if len(full) >= 2:
            first, last = full[0], full[-1]
            growth = (last[3] - first[3]) / first[3]
            print(
                f"RSS once full: {first[3] / 2**20:.1f} MiB at {first[0]:.0f}s -> "
                f"{last[3] / 2**20:.1f} MiB at {last[0]:.0f}s ({growth:+.1%}); "
                f"{last[2] - first[2]:,} items inserted (and as many dropped) meanwhile"
            )
        else:
            print("the table did not fill: run longer or lower --max-size")
    finally:
        open(stop_file, "w").close()
        for p in children:
            if p.poll() is None:
                p.kill()
        server.kill()
        server.wait()
        for log in logs.values():
            log.close()
            os.remove(log.name)
        for path in (port_file, stop_file):
            if os.path.exists(path):
                os.remove(path)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "monitor":
        monitor(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "sample":
        sample(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()
