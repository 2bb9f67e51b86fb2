"""Runs the benchmark workloads against this package and, side by side in the same run,
against the reference (dm-reverb 0.14.0 + tensorflow 2.15, Python 3.11, in its own
virtualenv), alternating the two. Prints absolute figures and ratios (medians).

    python bench/run.py [--reference-python PATH | --make-reference-venv DIR]
                        [--repeats 3] [--seconds 3] [--workloads a,b] [--modes inproc,remote]
                        [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = [
    "writer_small",
    "writer_small_nosig",
    "writer_frames",
    "writer_frames_nosig",
    "writer_strings",
    "legacy_writer",
    "writer_batched",
    "writer_vector",
    "structured_small",
    "structured_frames",
    "pattern_dataset",
    "client_sample",
    "prioritized",
    "dataset_small",
    "dataset_frames",
    "numpy_small",
    "numpy_frames",
    "actors2",
    "actors4",
    "latency_insert",
    "latency_sample",
    "memory",
    "dataset_setup",
    "tfclient_trace",
]
# Lower is better for these: their ratio is reference / ours.
LOWER_IS_BETTER = {
    "latency_insert",
    "latency_sample",
    "memory",
    "memory_1m",
    "memory_frames",
    "append_only",
    "import_time",
    "dataset_setup",
    "tfclient_trace",
}
# Measured in the benchmark's own process, whatever the mode: run once.
ONE_MODE = {"import_time", "dataset_setup", "tfclient_trace"}
OURS_ONLY = {"writer_batched", "writer_vector"}


def make_reference_venv(path: str) -> str:
    python = os.path.join(path, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "dm-reverb==0.14.0", "tensorflow-cpu==2.15.1"],
            check=True,
        )
    return python


def run_one(
    python: str, workload: str, mode: str, seconds: float, reference: bool = False
) -> Optional[dict]:
    """One run of `workload`: its JSON result (`value`, `unit`, maybe `p99`), or None."""
    args = [os.path.join(HERE, "workloads.py"), workload, mode, str(seconds)]
    return run_script(python, args, seconds * 10 + 120, f"{workload}/{mode}", reference)


def run_script(
    python: str, args: List[str], timeout: float, name: str, foreign: bool
) -> Optional[dict]:
    """Runs `python args` in /tmp and returns the JSON line it prints, or None (saying why
    on stderr, as `name`). A `foreign` interpreter (the reference's, a peer's) does not
    inherit `PYTHONPATH`, which may point at our package and shadow its own."""
    # One BLAS thread for every side: idle OpenBLAS threads otherwise spin on the 2 cores.
    env = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore", OPENBLAS_NUM_THREADS="1"
    )
    if foreign:
        env.pop("PYTHONPATH", None)
    try:
        out = subprocess.run(
            [python, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd="/tmp"
        )
    except subprocess.TimeoutExpired:
        print(f"  {name} timed out", file=sys.stderr)
        return None
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    print(f"  {name} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reference-python")
    parser.add_argument("--make-reference-venv")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--modes", default="inproc,remote")
    parser.add_argument("--markdown")
    args = parser.parse_args()

    reference = args.reference_python
    if args.make_reference_venv:
        reference = make_reference_venv(args.make_reference_venv)
    workloads = args.workloads.split(",")
    modes = args.modes.split(",")
    units = {
        "writer_small": "steps/s",
        "writer_small_nosig": "steps/s",
        "writer_frames": "MB/s",
        "writer_frames_nosig": "MB/s",
        "writer_strings": "steps/s",
        "legacy_writer": "steps/s",
        "writer_batched": "steps/s",
        "writer_vector": "steps/s",
        "structured_small": "steps/s",
        "structured_frames": "steps/s",
        "pattern_dataset": "steps/s",
        "client_sample": "samples/s",
        "prioritized": "samples/s",
        "actors2": "steps/s",
        "actors4": "steps/s",
        "latency_insert": "us (p50)",
        "latency_sample": "us (p50)",
        "memory": "bytes/item",
        "memory_1m": "bytes/item",
        "memory_frames": "% of frame bytes",
        "dataset_small": "samples/s",
        "dataset_frames": "MB/s",
        "numpy_small": "samples/s",
        "numpy_frames": "samples/s",
        "append_only": "us/append",
        "import_time": "ms",
        "dataset_setup": "ms",
        "tfclient_trace": "ms",
    }
    results: Dict[tuple, Dict[str, List[float]]] = {}
    for workload in workloads:
        for mode in modes:
            if workload.startswith("memory") and mode != "remote":
                continue  # measures the server process's RSS
            if workload in ONE_MODE and mode != modes[0]:
                continue
            key = (workload, mode)
            results[key] = {"ours": [], "reference": [], "ours_p99": [], "reference_p99": []}
            for _ in range(args.repeats):
                # Alternate, so both see the same machine conditions.
                sides = [("ours", sys.executable)]
                if reference and workload not in OURS_ONLY:
                    sides.append(("reference", reference))
                for side, python in sides:
                    result = run_one(
                        python, workload, mode, args.seconds, reference=side == "reference"
                    )
                    if result is not None:
                        results[key][side].append(result["value"])
                        if "p99" in result:
                            results[key][side + "_p99"].append(result["p99"])
            print(f"{workload}/{mode}: {results[key]}", file=sys.stderr)

    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d')}; "
        f"{args.repeats} runs of {args.seconds:g} s each, medians.",
        "",
        "| workload | server | ours | reference | ratio |",
        "|---|---|---|---|---|",
    ]
    for (workload, mode), values in results.items():
        ours = statistics.median(values["ours"]) if values["ours"] else None
        ref = statistics.median(values["reference"]) if values["reference"] else None
        unit = units[workload]
        if ours and ref:
            ratio = f"{(ref / ours if workload in LOWER_IS_BETTER else ours / ref):.1f}x"
        else:
            ratio = "n/a"
        ours_text = f"{ours:,.0f} {unit}{_p99(values['ours_p99'])}" if ours else "n/a"
        ref_text = f"{ref:,.0f} {unit}{_p99(values['reference_p99'])}" if ref else "n/a"
        server = "same process" if mode == "inproc" else "other process"
        lines.append(f"| {workload} | {server} | {ours_text} | {ref_text} | {ratio} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


def _p99(values: List[float]) -> str:
    """The text ', p99 N' (N the median of the runs' p99s), if the workload reported them."""
    return f", p99 {statistics.median(values):,.0f}" if values else ""


if __name__ == "__main__":
    main()
