"""Faults users meet: an actor process killed (SIGKILL) in the middle of an episode leaves
every item the server confirmed intact and sampleable, and the server keeps serving; a server
process killed and started again under running writers and samplers fails neither."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
from _standalone import start, stop
from _wait import wait_for

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
        assert confirmed >= 200, f"the actor confirmed only {confirmed} items in time"
        os.kill(actor.pid, signal.SIGKILL)
        actor.wait(T)
        actor.stdout.close()
        client = reverb.Client(address)
        size = client.server_info(timeout=T)["replay"].current_size
        assert size >= confirmed
        # Every stored item is whole: three consecutive steps, the obs matching the steps.
        samples = list(client.sample("replay", 100, emit_timesteps=False, timeout=T))
        assert len(samples) == 100
        for sample in samples:
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


def test_writers_and_samplers_carry_on_across_a_server_restart(tmp_path) -> None:
    """The server process is killed (SIGKILL) and a new one started on the same port while a
    writer and a sampler run: neither fails, the writer's later items reach the new server
    and the sampler goes on with them."""
    table = {
        "name": "replay",
        "sampler": "uniform",
        "remover": "fifo",
        "max_size": 1_000_000,
        "rate_limiter": {"min_size": 1},
    }
    proc, port, lines = start({"port": 0, "tables": [table]}, tmp_path)
    address = f"localhost:{port}"
    stop_event = threading.Event()
    errors: list = []
    confirmed: list = []
    seen: list = []

    def write() -> None:
        try:
            with reverb.Client(address).trajectory_writer(1) as writer:
                step = 0
                while not stop_event.is_set():
                    writer.append({"step": np.int64(step)})
                    writer.create_item("replay", 1.0, {"step": writer.history["step"][-1:]})
                    if step % 10 == 9:
                        writer.flush(timeout_ms=60_000)
                        confirmed.append(step)
                    step += 1
                    time.sleep(0.002)  # a time: paces the writer, as an environment would
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    def sample() -> None:
        try:
            with reverb.TrajectoryIterator(address, "replay") as samples:
                for s in samples:
                    seen.append(int(np.ravel(s.data[0])[0]))
                    if stop_event.is_set():
                        return
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=write), threading.Thread(target=sample)]
    restarted = None
    try:
        for t in threads:
            t.start()
        wait_for(
            lambda: len(confirmed) >= 5 and len(seen) >= 5,
            60,
            "items before the restart",
            failures=errors,
        )
        proc.kill()
        proc.communicate(timeout=T)
        last_before = confirmed[-1]
        restarted, _, restarted_lines = start({"port": port, "tables": [table]}, tmp_path)
        # Items written after the restart are confirmed by the new server and sampled.
        wait_for(
            lambda: confirmed[-1] >= last_before + 50,
            60,
            "items confirmed after the restart",
            failures=errors,
        )
        wait_for(
            lambda: max(seen) > last_before + 10,
            60,
            "samples of items after the restart",
            failures=errors,
        )
    finally:
        stop_event.set()
        for t in threads:
            t.join(T * 3)
        if proc.returncode is None:
            proc.kill()
            proc.communicate(timeout=T)
        if restarted is not None:
            stop(restarted, restarted_lines)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
