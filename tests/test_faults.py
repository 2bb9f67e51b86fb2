"""Faults users meet: an actor process killed (SIGKILL) in the middle of an episode leaves
every item the server confirmed intact and sampleable, and the server keeps serving."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

import reverb

T = 10.0

ACTOR = """
import sys, numpy as np, reverb
client = reverb.Client(sys.argv[1])
with client.trajectory_writer(3) as writer:
    step = 0
    while True:
        writer.append({"obs": np.full(64, step, np.float32), "step": np.int64(step)})
        if step >= 2:
            writer.create_item("replay", 1.0, {
                "obs": writer.history["obs"][-3:], "step": writer.history["step"][-3:]})
        if step % 50 == 49:
            writer.flush(timeout_ms=10000)
            print(step - 1, flush=True)  # items confirmed so far
        step += 1
"""


def test_an_actor_killed_mid_episode_loses_nothing_confirmed() -> None:
    server = reverb.Server(
        [
            reverb.Table(
                "replay",
                sampler=reverb.selectors.Uniform(),
                remover=reverb.selectors.Fifo(),
                max_size=1_000_000,
                rate_limiter=reverb.rate_limiters.MinSize(1),
            )
        ]
    )
    try:
        address = f"localhost:{server.port}"
        actor = subprocess.Popen(
            [sys.executable, "-c", ACTOR, address], stdout=subprocess.PIPE, text=True
        )
        confirmed = 0
        deadline = time.monotonic() + 60
        while confirmed < 200 and time.monotonic() < deadline:
            line = actor.stdout.readline()
            assert line, "the actor stopped"
            confirmed = int(line)
        os.kill(actor.pid, signal.SIGKILL)
        actor.wait(T)
        actor.stdout.close()
        client = reverb.Client(address)
        size = client.server_info(timeout=T)["replay"].current_size
        assert size >= confirmed
        # Every stored item is whole: three consecutive steps, the obs matching the steps.
        for sample in client.sample("replay", 100, emit_timesteps=False, timeout=T):
            obs, steps = sample.data
            assert steps.tolist() == list(range(steps[0], steps[0] + 3))
            np.testing.assert_array_equal(obs[:, 0], steps.astype(np.float32))
        # The server goes on serving new actors.
        with client.trajectory_writer(1) as writer:
            writer.append({"obs": np.zeros(64, np.float32), "step": np.int64(-1)})
            writer.create_item(
                "replay",
                1.0,
                {"obs": writer.history["obs"][-1:], "step": writer.history["step"][-1:]},
            )
        assert client.server_info(timeout=T)["replay"].current_size == size + 1
    finally:
        server.stop()
