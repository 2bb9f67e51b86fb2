"""Demo: the real loop. A server with a prioritized replay table; an actor process writing
2-step transitions with the trajectory writer; a learner reading batches through
`reverb.TrajectoryDataset` (a tf.data pipeline) and updating priorities, printing throughput
as it goes. Without TensorFlow the learner reads through `reverb.TrajectoryIterator` (numpy).

Run with `python examples/demo.py`.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any, Iterator

import numpy as np

import reverb

NUM_STEPS = 100_000
EPISODE_LENGTH = 1000
BATCH_SIZE = 256

try:
    import tensorflow as tf
except ImportError:
    tf = None


def actor(address: str, num_steps: int) -> None:
    """An environment loop: every step appends one transition; items are the last 2 steps."""
    client = reverb.Client(address)
    rng = np.random.default_rng(0)
    observations = rng.standard_normal((64, 8)).astype(np.float32)
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(num_steps):
            writer.append(
                {
                    "observation": observations[t % 64],
                    "action": np.int32(t % 4),
                    "reward": np.float32(1.0),
                }
            )
            if writer.episode_steps >= 2:
                history = writer.history
                writer.create_item(
                    "replay",
                    priority=1.0,
                    trajectory={
                        "observation": history["observation"][-2:],
                        "action": history["action"][-2:],
                        "reward": history["reward"][-1],
                    },
                )
            if writer.episode_steps == EPISODE_LENGTH:
                writer.end_episode()


def make_table() -> reverb.Table:
    signature = None
    if tf is not None:
        signature = {
            "observation": tf.TensorSpec([2, 8], tf.float32),
            "action": tf.TensorSpec([2], tf.int32),
            "reward": tf.TensorSpec([], tf.float32),
        }
    return reverb.Table(
        name="replay",
        sampler=reverb.selectors.Prioritized(priority_exponent=0.6),
        remover=reverb.selectors.Fifo(),
        max_size=100_000,
        rate_limiter=reverb.rate_limiters.MinSize(1000),
        signature=signature,
    )


def batches(address: str) -> Iterator[Any]:
    """Batches of `BATCH_SIZE` samples as (keys, rewards) numpy arrays."""
    if tf is not None:
        dataset = reverb.TrajectoryDataset.from_table_signature(
            address, "replay", max_in_flight_samples_per_worker=2 * BATCH_SIZE
        )
        for batch in dataset.batch(BATCH_SIZE).prefetch(2):
            yield batch.info.key.numpy(), batch.data["reward"].numpy()
    else:
        iterator = reverb.TrajectoryIterator(
            address, "replay", batch_size=BATCH_SIZE, max_in_flight_samples_per_worker=512
        )
        for batch in iterator:
            yield batch.info.key, batch.data[2]


def main() -> None:
    server = reverb.Server(tables=[make_table()])
    address = f"localhost:{server.port}"
    reader = "TrajectoryDataset (tf.data)" if tf is not None else "TrajectoryIterator (numpy)"
    print(f"server listening on {address}; the learner reads through {reader}")
    client = reverb.Client(address)

    start = time.perf_counter()
    process = multiprocessing.get_context("spawn").Process(target=actor, args=(address, NUM_STEPS))
    process.start()

    sampled, last_print = 0, start
    rng = np.random.default_rng(1)
    for keys, rewards in batches(address):
        sampled += len(keys)
        # A learner computes TD errors here; they become the sampled items' new priorities.
        new_priorities = np.abs(rewards - 0.5 + rng.normal(0.0, 0.5, len(keys))) + 1e-3
        client.mutate_priorities("replay", updates=dict(zip(keys.tolist(), new_priorities)))
        now = time.perf_counter()
        if now - last_print >= 0.5:
            last_print = now
            info = client.server_info(timeout=5)["replay"]
            inserted = info.rate_limiter_info.insert_stats.completed
            print(
                f"{now - start:6.2f}s  inserted={inserted:7d} ({inserted / (now - start):8,.0f}/s)"
                f"  sampled={sampled:8d} ({sampled / (now - start):9,.0f}/s)"
                f"  stored={info.current_size:6d}"
            )
        if not process.is_alive():
            break
    process.join()
    elapsed = time.perf_counter() - start
    info = client.server_info(timeout=5)["replay"]
    print(
        f"done in {elapsed:.1f}s: the actor wrote {NUM_STEPS} steps ({info.num_episodes} "
        f"episodes), the learner sampled {sampled} items and updated their priorities; "
        f"{info.current_size} items stored"
    )
    example = next(client.sample("replay", num_samples=1, emit_timesteps=False, timeout=5))
    print(f"one sample: info={example.info}")
    server.stop()


if __name__ == "__main__":
    main()
