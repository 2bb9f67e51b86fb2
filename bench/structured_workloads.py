"""Structured-writer workloads (run through `bench/workloads.py`): the configs an N-step
transition adder (N = 3, with shorter transitions at the end of each episode) and a sequence
adder (10 steps, period 5) build, written by one `StructuredWriter` into two tables whose
signatures come from `infer_signature`, as Acme's agents set them. Episodes end every 1000
steps (frames: 500). Only API both packages share."""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

import reverb
from reverb import structured_writer as sw

N_STEP = 3
SEQUENCE, PERIOD = 10, 5


def step_spec(frames: bool) -> dict:
    """The step: observation (float32[8] or uint8 84x84), action, reward, discount."""
    obs = tf.TensorSpec([84, 84], tf.uint8) if frames else tf.TensorSpec([8], tf.float32)
    return {
        "observation": obs,
        "action": tf.TensorSpec([], tf.int32),
        "reward": tf.TensorSpec([], tf.float32),
        "discount": tf.TensorSpec([], tf.float32),
    }


def _transition(ref: dict, n: int) -> dict:
    return {
        "observation": ref["observation"][-(n + 1)],
        "action": ref["action"][-(n + 1)],
        "rewards": ref["reward"][-(n + 1) : -1],
        "discounts": ref["discount"][-(n + 1) : -1],
        "next_observation": ref["observation"][-1],
    }


def transition_configs() -> list:
    """N-step transitions every step, and the shorter ones when the episode ends."""
    ref = sw.create_reference_step(step_spec(False))
    C = sw.Condition
    configs = [sw.create_config(_transition(ref, N_STEP), "nstep", [C.step_index() >= N_STEP])]
    for n in range(1, N_STEP):
        conditions = [C.is_end_episode(), C.step_index() >= n]
        configs.append(sw.create_config(_transition(ref, n), "nstep", conditions))
    return configs


def sequence_configs() -> list:
    """Sequences of SEQUENCE steps every PERIOD steps."""
    ref = sw.create_reference_step(step_spec(False))
    C = sw.Condition
    pattern = {k: ref[k][-SEQUENCE:] for k in ("observation", "action", "reward", "discount")}
    conditions = [
        C.step_index() >= SEQUENCE - 1,
        C.step_index() % PERIOD == (SEQUENCE - 1) % PERIOD,
    ]
    return [sw.create_config(pattern, "sequence", conditions)]


def tables(max_size: int) -> list:
    """The two tables, with signatures for small steps and for frames."""
    out = []
    for frames in (False, True):
        suffix = "_frames" if frames else ""
        for name, configs in (("nstep", transition_configs()), ("sequence", sequence_configs())):
            out.append(
                reverb.Table(
                    name=name + suffix,
                    sampler=reverb.selectors.Uniform(),
                    remover=reverb.selectors.Fifo(),
                    max_size=max_size,
                    rate_limiter=reverb.rate_limiters.MinSize(1),
                    signature=sw.infer_signature(configs, step_spec(frames)),
                )
            )
    return out


def _retarget(configs: list, suffix: str) -> list:
    out = []
    for config in configs:
        copy = sw.Config()
        copy.CopyFrom(config)
        copy.table = config.table + suffix
        out.append(copy)
    return out


def _write(address: str, seconds: float, frames: bool) -> float:
    suffix = "_frames" if frames else ""
    configs = _retarget(transition_configs() + sequence_configs(), suffix)
    client = reverb.Client(address)
    rng = np.random.default_rng(0)
    if frames:
        observations = [rng.integers(0, 255, (84, 84), dtype=np.uint8) for _ in range(16)]
    else:
        observations = [rng.random(8, dtype=np.float32) for _ in range(16)]
    episode = 500 if frames else 1000
    steps = 0
    writer = client.structured_writer(configs)
    start = time.perf_counter()
    while True:
        for _ in range(100):
            writer.append(
                {
                    "observation": observations[steps % 16],
                    "action": np.int32(steps),
                    "reward": np.float32(1.0),
                    "discount": np.float32(0.99),
                }
            )
            steps += 1
            if steps % episode == 0:
                writer.end_episode()
        if time.perf_counter() - start > seconds:
            break
    writer.flush()
    return steps / (time.perf_counter() - start)


def structured_small(setup, seconds: float) -> dict:
    """StructuredWriter, small steps: N-step transitions + sequences, with signatures."""
    return {"value": _write(setup.address, seconds, False), "unit": "steps/s"}


def structured_frames(setup, seconds: float) -> dict:
    """StructuredWriter, 84x84 uint8 observations: N-step transitions + sequences."""
    return {"value": _write(setup.address, seconds, True), "unit": "steps/s"}


def pattern_dataset(setup, seconds: float) -> dict:
    """PatternDataset, offline, as a learner reads it: 3-step transitions (every step from the
    episode's third) over a `tf.data` stream of small steps (episodes of 1000), in batches of
    256 counted in the graph (no server)."""
    del setup
    configs = transition_configs()[:1]

    def step(i):
        return {
            "observation": tf.fill([8], tf.cast(i, tf.float32)),
            "action": tf.cast(i, tf.int32),
            "reward": tf.constant(1.0),
            "discount": tf.constant(0.99),
        }

    n = 50_000
    steps = tf.data.Dataset.range(n).map(step)
    dataset = reverb.PatternDataset(
        steps, configs, True, lambda s: tf.equal(s["action"] % 1000, 999)
    ).batch(256)
    count = tf.function(lambda: dataset.reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
    count()  # traced once
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        count()
        done += n
    return {"value": done / (time.perf_counter() - start), "unit": "steps/s"}


WORKLOADS = {
    "structured_small": structured_small,
    "structured_frames": structured_frames,
    "pattern_dataset": pattern_dataset,
}
