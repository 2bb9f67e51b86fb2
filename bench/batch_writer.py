"""A/B of batched inserts: `Client.insert_steps` (waits for each batch to be stored) against a
`BatchWriter` (several batches in flight, flushed at the end of each block), alternating in
blocks of calls of 256 of the peers' small transitions into a table kept full (every insert
removes one), with the server in this process or another.

    python bench/batch_writer.py [--mode process|inproc] [--calls 1000] [--blocks 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import peers  # noqa: E402
import workloads  # noqa: E402

import reverb  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["process", "inproc"], default="process")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--max-in-flight-items", type=int, default=4096)
    args = parser.parse_args()
    setup = workloads.Setup(args.mode)
    try:
        client = reverb.Client(setup.address)
        steps = peers.small_steps(peers.BATCH)
        priorities = {workloads.TRANSITIONS: 1.0}
        # The table full (1M items): every insert then removes the oldest item.
        for _ in range(1_000_000 // peers.BATCH + 100):
            client.insert_steps(steps, priorities)
        writer = client.batch_writer(max_in_flight_items=args.max_in_flight_items)
        rates: dict = {"insert_steps": [], "batch_writer": []}
        for _ in range(args.blocks):
            start = time.perf_counter()
            for _ in range(args.calls):
                client.insert_steps(steps, priorities)
            rates["insert_steps"].append(args.calls * peers.BATCH / (time.perf_counter() - start))
            start = time.perf_counter()
            for _ in range(args.calls):
                writer.insert_steps(steps, priorities)
            writer.flush()
            rates["batch_writer"].append(args.calls * peers.BATCH / (time.perf_counter() - start))
        writer.close()
        for name, values in rates.items():
            print(
                f"{args.mode} {name}: " + ", ".join(f"{v / 1e6:.2f}" for v in values) + " M steps/s"
            )
    finally:
        setup.close()


if __name__ == "__main__":
    main()
