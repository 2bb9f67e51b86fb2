"""Side by side with the replay buffers RL researchers also use, on the cases of
`../shared/notes/anchors.md` (the same data for every system): cpprb, flashbax (JAX on
the CPU, its buffer functions jit-compiled as its documentation shows), rlox (its
`ReplayBuffer` / `PrioritizedReplayBuffer`; float32 actions, no frames), TorchRL (replay
buffers over a `LazyTensorStorage`, batches as torch tensors) and echo (id-echo, a networked
FIFO: actors stream steps over TCP to a server in the learner's process; no replay, so only
the networked case):

- a small transition: obs float32[8], action int32, reward float32, next_obs float32[8]
  (72 B, random floats); a frame item: obs uint8[84, 84] and a reward (7,060 B);
- `sample_small` / `sample_frames`: uniform batches of 256 from 100k / 20k items;
- `prioritized`: a learner round, sample 256 (priority exponent 0.6) and update their 256
  priorities, from 100k small items;
- `insert_small_1` / `insert_small_256`: small transitions inserted one per call (ours: a
  trajectory writer, an item per step), or 256 per call (ours: a `BatchWriter`, several
  batches in flight, flushed every 20 calls), timed until stored;
- `learner_small`: a learner's loop, a uniform batch of 256 small transitions then a step
  of numpy work on it (an MLP's forward pass over the observations, 128 wide: about 0.3 ms
  on the 2-vCPU VM): what sampling costs a learner that does something with its batches;
- `networked_small`: an actor process sends small transitions, one step per call (episodes
  of 1000 steps where the system has episodes), over loopback TCP into a FIFO that the
  learner (this process) reads in batches of 256, each step delivered once: the steps per
  second the learner receives. Ours: a queue table with a signature fed by a trajectory
  writer (an item per step); echo: its TCP client into its server, which lives in the
  learner's process. The in-process buffers have no such case.

Ours runs twice: with the server in the benchmark's process (`ours`; the in-process buffers
have no other setting), and with the server in another process, reached over loopback gRPC
(`ours-remote`, as a learner reaches a replay server; in `networked_small` the actor is a
third process), through the APIs users call:
`TrajectoryIterator`, `mutate_priorities`, trajectory writers into tables with signatures.
Each peer runs in its own virtualenv under `~/.cache/reverb-peers/NAME`, made on first use
with the pinned versions below.

    python bench/peers.py [--peers cpprb] [--cases sample_small,...] [--repeats 3]
        [--seconds 3] [--markdown FILE]

    python bench/peers.py run SYSTEM CASE SECONDS   (one measurement: prints a JSON line)
    python bench/peers.py actor SYSTEM ADDRESS       (networked_small's actor, until killed)
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
from typing import Callable, Dict, List, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# Each peer's pinned requirements (its virtualenv is made from them once).
PEERS: Dict[str, List[str]] = {
    "cpprb": ["cpprb==11.0.0", "numpy==2.4.6"],
    # JAX on the CPU (the buffer lives on the device; here that is the CPU).
    "flashbax": ["flashbax==0.1.3", "jax[cpu]==0.4.38", "numpy==2.2.6"],
    "rlox": ["rlox==1.2.0", "numpy==2.2.6"],
    "torchrl": ["torchrl==0.14.1", "tensordict==0.14.3", "torch==2.15.0", "numpy==2.2.6"],
    "echo": ["id-echo==0.2.1", "optree==0.20.0", "numpy==2.2.6"],
}
# Cases a peer has no buffer for (its table cell says n/a).
UNSUPPORTED: Dict[str, List[str]] = {
    # rlox's buffers hold float32 observation vectors (and float32 actions): no uint8 frames.
    "rlox": ["sample_frames", "networked_small"],
    "cpprb": ["networked_small"],
    "flashbax": ["networked_small"],
    "torchrl": ["networked_small"],
}
CASES = [
    "sample_small",
    "sample_frames",
    "prioritized",
    "insert_small_1",
    "insert_small_256",
    "learner_small",
    "networked_small",
]
# echo is a FIFO without replay: only the networked case.
UNSUPPORTED["echo"] = [c for c in CASES if c != "networked_small"]
SMALL_ITEMS = 100_000
FRAME_ITEMS = 20_000
BATCH = 256


def small_steps(n: int) -> Dict[str, np.ndarray]:
    """`n` small transitions (random floats)."""
    rng = np.random.default_rng(0)
    return {
        "obs": rng.random((n, 8), dtype=np.float32),
        "action": np.arange(n, dtype=np.int32),
        "reward": np.ones(n, np.float32),
        "next_obs": rng.random((n, 8), dtype=np.float32),
    }


def frame_steps(n: int) -> Dict[str, np.ndarray]:
    """`n` frame items (random bytes)."""
    rng = np.random.default_rng(0)
    return {
        "obs": rng.integers(0, 255, (n, 84, 84), dtype=np.uint8),
        "reward": np.arange(n, dtype=np.float32),
    }


_WEIGHTS = (
    np.random.default_rng(2).random((8, 128), dtype=np.float32),
    np.random.default_rng(3).random((128, 128), dtype=np.float32),
)


def learner_step(obs: np.ndarray) -> None:
    """The learner's work on a batch of observations: an MLP's forward pass (numpy)."""
    w1, w2 = _WEIGHTS
    hidden = np.maximum(np.asarray(obs, np.float32).reshape(len(obs), 8) @ w1, 0.0)
    float(np.tanh(hidden @ w2).sum())


def actor(system: str, target: str) -> subprocess.Popen:
    """The actor process of `networked_small`: sends small transitions, one step per call,
    to `target` (an address) until killed."""
    python = sys.executable if system in OURS else peer_python(system)
    return subprocess.Popen(
        [python, os.path.abspath(__file__), "actor", system, target],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def act(system: str, target: str) -> None:
    """The body of `actor`, in the actor process."""
    steps = small_steps(1000)
    if system == "echo":
        import echo

        host, port = target.rsplit(":", 1)
        client = echo.TcpClient(host, int(port), _echo_example())
        while True:
            for t in range(1000):
                client.send({k: v[t] for k, v in steps.items()})
    sys.path.insert(0, HERE)
    import workloads

    import reverb

    client = reverb.Client(target)
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        while True:
            write_episode(writer, workloads.TRANSITION_QUEUE, steps)


def received(seconds: float, batches: Callable[[], int], feeder: subprocess.Popen) -> float:
    """Steps per second a learner receives through `batches` (the steps of one batch) while
    `feeder` runs; the first batch (the actor starting) is not timed."""
    try:
        rate = timed(seconds, batches)
        if feeder.poll() is not None:
            raise RuntimeError(f"the actor process exited ({feeder.returncode})")
        return rate
    finally:
        feeder.kill()
        feeder.wait()


def timed(seconds: float, step: Callable[[], int]) -> float:
    """Calls `step` (returning the items it handled) for `seconds`; items per second."""
    step()  # warm-up
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += step()
    return done / (time.perf_counter() - start)


# --- ours -------------------------------------------------------------------------------


def ours(case: str, seconds: float, mode: str = "inproc") -> float:
    """Ours, the server in this process (`mode` "inproc") or in another ("process")."""
    sys.path.insert(0, HERE)
    import workloads

    import reverb

    setup = workloads.Setup(mode)
    try:
        address = setup.address
        client = reverb.Client(address)
        if case in ("sample_small", "sample_frames", "learner_small"):
            small = case != "sample_frames"
            table = workloads.TRANSITIONS if small else workloads.FRAME_ITEMS
            steps = small_steps(SMALL_ITEMS) if small else frame_steps(FRAME_ITEMS)
            _fill(client, table, steps)
            it = reverb.TrajectoryIterator(
                address, table, batch_size=BATCH, unpack_as_table_signature=True
            )
            if case == "learner_small":

                def learn() -> int:
                    batch = next(it)
                    learner_step(batch.data["obs"])
                    return len(batch.info.key)

                return timed(seconds, learn)
            return timed(seconds, lambda: len(next(it).info.key))
        if case == "prioritized":
            _fill(client, workloads.PRIORITIZED, small_steps(SMALL_ITEMS))
            it = reverb.TrajectoryIterator(address, workloads.PRIORITIZED, batch_size=BATCH)
            rng = np.random.default_rng(1)

            def round_() -> int:
                keys = next(it).info.key
                client.mutate_priorities(
                    workloads.PRIORITIZED, updates=dict(zip(keys.tolist(), rng.random(len(keys))))
                )
                return len(keys)

            return timed(seconds, round_)
        if case == "networked_small":
            feeder = actor("ours", address)
            it = reverb.TrajectoryIterator(
                address,
                workloads.TRANSITION_QUEUE,
                batch_size=BATCH,
                rate_limiter_timeout_ms=60_000,
                unpack_as_table_signature=True,
            )
            return received(seconds, lambda: len(next(it).info.key), feeder)
        if case == "insert_small_1":
            steps = small_steps(1000)
            with client.trajectory_writer(num_keep_alive_refs=1) as writer:

                def one() -> int:
                    write_episode(writer, workloads.TRANSITIONS, steps)
                    writer.flush()
                    return 1000

                return timed(seconds, one)
        if case == "insert_small_256":
            steps = small_steps(BATCH)
            writer = client.batch_writer()

            def many() -> int:
                for _ in range(20):
                    writer.insert_steps(steps, {workloads.TRANSITIONS: 1.0})
                writer.flush()
                return 20 * BATCH

            return timed(seconds, many)
        raise ValueError(f"unknown case {case}")
    finally:
        setup.close()


def _fill(client, table: str, steps: Dict[str, np.ndarray]) -> None:
    """One item per step, episodes of 1000 steps, as an actor writing transitions does."""
    n = len(next(iter(steps.values())))
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for start in range(0, n, 1000):
            write_episode(writer, table, {k: v[start : start + 1000] for k, v in steps.items()})
        writer.flush()


def write_episode(writer, table: str, steps: Dict[str, np.ndarray]) -> None:
    """`steps` (arrays over steps) appended as one episode through a trajectory writer, an
    item of each step in `table`, as an actor writing transitions does."""
    for t in range(len(next(iter(steps.values())))):
        writer.append({k: v[t] for k, v in steps.items()})
        writer.create_item(table, 1.0, {k: v[-1] for k, v in writer.history.items()})
    writer.end_episode()


# --- cpprb ------------------------------------------------------------------------------


def cpprb(case: str, seconds: float) -> float:
    import cpprb as lib

    small = {
        "obs": {"shape": 8},
        "action": {"dtype": np.int32},
        "reward": {},
        "next_obs": {"shape": 8},
    }
    if case in ("sample_small", "sample_frames"):
        if case == "sample_small":
            rb = lib.ReplayBuffer(SMALL_ITEMS, env_dict=small)
            rb.add(**small_steps(SMALL_ITEMS))
        else:
            frames = {"obs": {"shape": (84, 84), "dtype": np.uint8}, "reward": {}}
            rb = lib.ReplayBuffer(FRAME_ITEMS, env_dict=frames)
            rb.add(**frame_steps(FRAME_ITEMS))
        return timed(seconds, lambda: len(rb.sample(BATCH)["reward"]))
    if case == "learner_small":
        rb = lib.ReplayBuffer(SMALL_ITEMS, env_dict=small)
        rb.add(**small_steps(SMALL_ITEMS))

        def learn() -> int:
            learner_step(rb.sample(BATCH)["obs"])
            return BATCH

        return timed(seconds, learn)
    if case == "prioritized":
        rb = lib.PrioritizedReplayBuffer(SMALL_ITEMS, env_dict=small, alpha=0.6)
        rb.add(**small_steps(SMALL_ITEMS))
        rng = np.random.default_rng(1)

        def round_() -> int:
            got = rb.sample(BATCH, beta=0.4)
            rb.update_priorities(got["indexes"], rng.random(BATCH))
            return BATCH

        return timed(seconds, round_)
    if case in ("insert_small_1", "insert_small_256"):
        rb = lib.ReplayBuffer(1_000_000, env_dict=small)
        if case == "insert_small_1":
            steps = small_steps(1000)
            rows = [{k: v[t] for k, v in steps.items()} for t in range(1000)]

            def one() -> int:
                for row in rows:
                    rb.add(**row)
                return 1000

            return timed(seconds, one)
        steps = small_steps(BATCH)

        def many() -> int:
            for _ in range(20):
                rb.add(**steps)
            return 20 * BATCH

        return timed(seconds, many)
    raise ValueError(f"unknown case {case}")


# --- flashbax -----------------------------------------------------------------------------


def flashbax(case: str, seconds: float) -> float:
    import warnings

    import flashbax as fbx
    import jax
    import jax.numpy as jnp

    warnings.filterwarnings("ignore")  # (buffer donation is a no-op on some backends)
    key = jax.random.PRNGKey(0)
    if case in ("sample_small", "sample_frames", "prioritized", "learner_small"):
        steps = frame_steps(FRAME_ITEMS) if case == "sample_frames" else small_steps(SMALL_ITEMS)
        n, rows = len(steps["reward"]), 1000
        if case == "prioritized":
            buffer = fbx.make_prioritised_flat_buffer(
                max_length=n,
                min_length=BATCH,
                sample_batch_size=BATCH,
                add_batch_size=rows,
                priority_exponent=0.6,
            )
        else:
            buffer = fbx.make_flat_buffer(
                max_length=n, min_length=BATCH, sample_batch_size=BATCH, add_batch_size=rows
            )
        state = buffer.init({k: jnp.asarray(v[0]) for k, v in steps.items()})
        add = jax.jit(buffer.add, donate_argnums=0)
        for i in range(0, n, rows):
            state = add(state, {k: jnp.asarray(v[i : i + rows]) for k, v in steps.items()})
        sample = jax.jit(buffer.sample)
        if case == "learner_small":

            def learn() -> int:
                nonlocal key
                key, sub = jax.random.split(key)
                learner_step(np.asarray(sample(state, sub).experience.first["obs"]))
                return BATCH

            return timed(seconds, learn)
        if case != "prioritized":

            def draw() -> int:
                nonlocal key
                key, sub = jax.random.split(key)
                jax.block_until_ready(sample(state, sub))
                return BATCH

            return timed(seconds, draw)
        set_priorities = jax.jit(buffer.set_priorities, donate_argnums=0)
        rng = np.random.default_rng(1)

        def round_() -> int:
            nonlocal key, state
            key, sub = jax.random.split(key)
            got = sample(state, sub)
            new = jnp.asarray(rng.random(BATCH, dtype=np.float32))
            state = jax.block_until_ready(set_priorities(state, got.indices, new))
            return BATCH

        return timed(seconds, round_)
    if case in ("insert_small_1", "insert_small_256"):
        one = case == "insert_small_1"
        buffer = fbx.make_flat_buffer(
            max_length=1_000_000,
            min_length=2,
            sample_batch_size=BATCH,
            add_batch_size=None if one else BATCH,
        )
        steps = small_steps(1000 if one else BATCH)
        state = buffer.init({k: jnp.asarray(v[0]) for k, v in steps.items()})
        add = jax.jit(buffer.add, donate_argnums=0)
        if one:
            rows = [{k: v[t] for k, v in steps.items()} for t in range(1000)]

            def ones() -> int:
                nonlocal state
                for row in rows:
                    state = add(state, row)
                jax.block_until_ready(state)
                return 1000

            return timed(seconds, ones)

        def many() -> int:
            nonlocal state
            for _ in range(20):
                state = add(state, steps)
            jax.block_until_ready(state)
            return 20 * BATCH

        return timed(seconds, many)
    raise ValueError(f"unknown case {case}")


# --- rlox ---------------------------------------------------------------------------------


def rlox(case: str, seconds: float) -> float:
    import rlox as lib

    def push_all(rb, steps: Dict[str, np.ndarray]) -> None:
        n = len(steps["action"])
        flags = np.zeros(n, np.uint8)
        rb.push_batch(
            steps["obs"].ravel(),
            steps["next_obs"].ravel(),
            steps["action"].astype(np.float32),
            steps["reward"],
            flags,
            flags,
        )

    seeds = iter(range(1 << 62))
    if case in ("sample_small", "learner_small"):
        rb = lib.ReplayBuffer(SMALL_ITEMS, 8, 1)
        push_all(rb, small_steps(SMALL_ITEMS))
        if case == "sample_small":
            return timed(seconds, lambda: len(rb.sample(BATCH, next(seeds))["rewards"]))

        def learn() -> int:
            learner_step(rb.sample(BATCH, next(seeds))["obs"])
            return BATCH

        return timed(seconds, learn)
    if case == "prioritized":
        rb = lib.PrioritizedReplayBuffer(SMALL_ITEMS, 8, 1, alpha=0.6, beta=0.4)
        steps = small_steps(SMALL_ITEMS)
        for t in range(SMALL_ITEMS):  # (its prioritized buffer has no batched push)
            rb.push(
                steps["obs"][t],
                steps["action"][t : t + 1].astype(np.float32),
                float(steps["reward"][t]),
                False,
                False,
                next_obs=steps["next_obs"][t],
            )
        rng = np.random.default_rng(1)

        def round_() -> int:
            got = rb.sample(BATCH, next(seeds))
            rb.update_priorities(got["indices"], rng.random(BATCH))
            return BATCH

        return timed(seconds, round_)
    if case in ("insert_small_1", "insert_small_256"):
        rb = lib.ReplayBuffer(1_000_000, 8, 1)
        if case == "insert_small_1":
            steps = small_steps(1000)
            actions = steps["action"].astype(np.float32).reshape(-1, 1)

            def one() -> int:
                for t in range(1000):
                    rb.push(
                        steps["obs"][t],
                        actions[t],
                        float(steps["reward"][t]),
                        False,
                        False,
                        next_obs=steps["next_obs"][t],
                    )
                return 1000

            return timed(seconds, one)
        steps = small_steps(BATCH)

        def many() -> int:
            for _ in range(20):
                push_all(rb, steps)
            return 20 * BATCH

        return timed(seconds, many)
    raise ValueError(f"unknown case {case}")


# --- TorchRL ------------------------------------------------------------------------------


def torchrl(case: str, seconds: float) -> float:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer, TensorDictPrioritizedReplayBuffer

    # One thread, as every side's BLAS has: idle OpenMP threads otherwise spin on the 2 cores.
    torch.set_num_threads(1)

    def tensors(steps: Dict[str, np.ndarray]) -> TensorDict:
        n = len(next(iter(steps.values())))
        return TensorDict({k: torch.from_numpy(v) for k, v in steps.items()}, batch_size=[n])

    if case in ("sample_small", "sample_frames", "learner_small"):
        n, steps = (
            (FRAME_ITEMS, frame_steps(FRAME_ITEMS))
            if case == "sample_frames"
            else (SMALL_ITEMS, small_steps(SMALL_ITEMS))
        )
        rb = ReplayBuffer(storage=LazyTensorStorage(n), batch_size=BATCH)
        rb.extend(tensors(steps))
        if case != "learner_small":
            return timed(seconds, lambda: len(rb.sample()["reward"]))

        def learn() -> int:
            learner_step(rb.sample()["obs"].numpy())
            return BATCH

        return timed(seconds, learn)
    if case == "prioritized":
        rb = TensorDictPrioritizedReplayBuffer(
            alpha=0.6, beta=0.4, storage=LazyTensorStorage(SMALL_ITEMS), batch_size=BATCH
        )
        rb.extend(tensors(small_steps(SMALL_ITEMS)))
        rng = np.random.default_rng(1)

        def round_() -> int:
            got = rb.sample()
            rb.update_priority(got["index"], torch.from_numpy(rng.random(BATCH, np.float32)))
            return BATCH

        return timed(seconds, round_)
    if case in ("insert_small_1", "insert_small_256"):
        rb = ReplayBuffer(storage=LazyTensorStorage(1_000_000))
        if case == "insert_small_1":
            steps = tensors(small_steps(1000))
            rows = [steps[t] for t in range(1000)]

            def one() -> int:
                for row in rows:
                    rb.add(row)
                return 1000

            return timed(seconds, one)
        batch = tensors(small_steps(BATCH))

        def many() -> int:
            for _ in range(20):
                rb.extend(batch)
            return 20 * BATCH

        return timed(seconds, many)
    raise ValueError(f"unknown case {case}")


def _echo_example() -> Dict[str, np.ndarray]:
    """The small transition's structure, as echo's server and client take it."""
    return {k: np.zeros_like(v[0]) for k, v in small_steps(1).items()}


def echo(case: str, seconds: float) -> float:
    """echo: its server (TCP transport) in this process, fed by an actor process."""
    import echo as echo_lib

    assert case == "networked_small", case
    server = echo_lib.Server(_echo_example(), BATCH, transport=echo_lib.TcpTransport(0))
    server.start()
    try:
        feeder = actor("echo", f"127.0.0.1:{server.port}")

        def batch() -> int:
            sample = server.sample()
            if sample is None:
                raise RuntimeError("the echo server shut down")
            return len(sample.batch["action"])

        return received(seconds, batch, feeder)
    finally:
        server.close()


def ours_remote(case: str, seconds: float) -> float:
    """Ours with the server in another process."""
    return ours(case, seconds, "process")


SYSTEMS = {
    "ours": ours,
    "ours-remote": ours_remote,
    "cpprb": cpprb,
    "flashbax": flashbax,
    "rlox": rlox,
    "torchrl": torchrl,
    "echo": echo,
}
OURS = ["ours", "ours-remote"]


# --- the runner ---------------------------------------------------------------------------


def peer_python(name: str) -> str:
    """The interpreter of `name`'s virtualenv, made with its pinned requirements if missing."""
    path = os.path.expanduser(f"~/.cache/reverb-peers/{name}")
    python = os.path.join(path, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *PEERS[name]], check=True)
    return python


def run_one(system: str, python: str, case: str, seconds: float) -> Optional[float]:
    """One measurement of `system` on `case` in its interpreter (items/s), or None."""
    sys.path.insert(0, HERE)
    from run import run_script

    args = [os.path.abspath(__file__), "run", system, case, str(seconds)]
    result = run_script(python, args, seconds * 10 + 300, f"{system}/{case}", system not in OURS)
    return None if result is None else result["value"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "run":
        system, case, seconds = sys.argv[2], sys.argv[3], float(sys.argv[4])
        value = SYSTEMS[system](case, seconds)
        print(json.dumps({"system": system, "case": case, "value": value}))
        sys.stdout.flush()
        os._exit(0)  # (do not wait for a server's background threads)
    if len(sys.argv) > 1 and sys.argv[1] == "actor":
        act(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--markdown")
    args = parser.parse_args()
    peers = [p for p in args.peers.split(",") if p]
    systems = [(o, sys.executable) for o in OURS] + [(p, peer_python(p)) for p in peers]
    results: Dict[str, Dict[str, List[float]]] = {}
    for case in args.cases.split(","):
        results[case] = {name: [] for name, _ in systems}
        for _ in range(args.repeats):
            for name, python in systems:  # alternating, so all see the same machine
                if case in UNSUPPORTED.get(name, []):
                    continue
                value = run_one(name, python, case, args.seconds)
                if value is not None:
                    results[case][name].append(value)
        print(f"{case}: {results[case]}", file=sys.stderr)
    names = [name for name, _ in systems]
    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; {time.strftime('%Y-%m-%d')}; {args.repeats} runs of "
        f"{args.seconds:g} s each, medians (items/s; ratio = ours / peer).",
        "",
        "| case | " + " | ".join(names + [f"{o} / {p}" for p in peers for o in OURS]) + " |",
        "|---" * (1 + len(names) + len(OURS) * len(peers)) + "|",
    ]
    for case, by in results.items():
        med = {n: statistics.median(v) if v else None for n, v in by.items()}
        cells = [f"{med[n]:,.0f}" if med[n] else "n/a" for n in names]
        ratios = [
            f"{med[o] / med[p]:.2f}x" if med[o] and med[p] else "n/a" for p in peers for o in OURS
        ]
        lines.append(f"| {case} | " + " | ".join(cells + ratios) + " |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
