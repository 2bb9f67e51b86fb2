"""Demo: a server with one table, an actor writing 2-step transitions with the trajectory
writer, a learner sampling them and updating priorities.

Run with `python examples/demo.py`.
"""

from __future__ import annotations

import threading
import time

import numpy as np

import reverb

NUM_STEPS = 200_000
EPISODE_LENGTH = 1000


def actor(address: str) -> None:
    client = reverb.Client(address)
    rng = np.random.default_rng(0)
    observations = rng.standard_normal((64, 8)).astype(np.float32)
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(NUM_STEPS):
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


def main() -> None:
    server = reverb.Server(
        tables=[
            reverb.Table(
                name="replay",
                sampler=reverb.selectors.Prioritized(priority_exponent=0.6),
                remover=reverb.selectors.Fifo(),
                max_size=100_000,
                rate_limiter=reverb.rate_limiters.MinSize(100),
            )
        ]
    )
    address = f"localhost:{server.port}"
    print(f"server listening on {address}")
    client = reverb.Client(address)

    start = time.perf_counter()
    writer = threading.Thread(target=actor, args=(address,))
    writer.start()

    sampled = 0
    while writer.is_alive():
        for sample in client.sample("replay", num_samples=256, emit_timesteps=False, timeout=10):
            sampled += 1
            # Learners update priorities, e.g. with TD errors.
            if sampled % 1000 == 0:
                client.mutate_priorities("replay", updates={sample.info.key: 2.0})
        info = client.server_info(timeout=5)["replay"]
        elapsed = time.perf_counter() - start
        print(
            f"{elapsed:6.2f}s  stored={info.current_size:6d}  "
            f"inserted={info.rate_limiter_info.insert_stats.completed:6d}  sampled={sampled:7d}"
        )
        time.sleep(0.5)
    writer.join()
    elapsed = time.perf_counter() - start
    info = client.server_info(timeout=5)["replay"]
    print(
        f"done: {NUM_STEPS} steps written ({NUM_STEPS / elapsed:,.0f} steps/s through the "
        f"trajectory writer), {sampled} samples taken, {info.current_size} items stored, "
        f"{info.num_episodes} episodes"
    )
    example = next(client.sample("replay", num_samples=1, emit_timesteps=False, timeout=5))
    print(f"one sample: info={example.info}")
    print(f"            data={[a.tolist() for a in example.data]}")
    server.stop()


if __name__ == "__main__":
    main()
