"""Checkpoints: save, stop, restart in a new process, and get the same tables back; atomic
publication; corruption detection; saving while writers and samplers run."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from _wait import wait_for

import reverb
from reverb import checkpointers, rate_limiters, selectors

T = 10.0

# The tables of every server in this module (a server script is built from this source).
TABLES_SOURCE = textwrap.dedent(
    """
    import reverb
    from reverb import rate_limiters, selectors

    def tables(max_size=100):
        return [
            reverb.Table("fifo", selectors.Fifo(), selectors.Fifo(), max_size,
                         rate_limiters.MinSize(1)),
            reverb.Table("prio", selectors.Prioritized(0.8), selectors.MaxHeap(), max_size,
                         rate_limiters.SampleToInsertRatio(2.0, 1, 1000.0)),
            reverb.Table("heap", selectors.MinHeap(), selectors.Fifo(), max_size,
                         rate_limiters.MinSize(1), max_times_sampled=3),
        ]
    """
)
namespace: dict = {}
exec(TABLES_SOURCE, namespace)  # noqa: S102 - our own source, shared with child processes
tables = namespace["tables"]


def fill(client: reverb.Client, steps: int = 30) -> None:
    with client.trajectory_writer(3) as writer:
        for t in range(steps):
            writer.append({"obs": np.full(4, t, np.float32), "t": np.int64(t)})
            if t >= 2:
                traj = {"obs": writer.history["obs"][-3:], "t": writer.history["t"][-1]}
                writer.create_item("fifo", 1.0, traj)
                writer.create_item("prio", float(t % 7), traj)
                writer.create_item("heap", float(t % 5), traj)
            if t % 10 == 9:
                writer.end_episode()
    # Some sampling and priority updates, so counters are not trivial.
    list(client.sample("prio", 5, emit_timesteps=False, timeout=T))
    list(client.sample("heap", 4, emit_timesteps=False, timeout=T))
    client.mutate_priorities("fifo", deletes=[])


def contents(client: reverb.Client) -> dict:
    """Everything observable: infos, and the deterministic sampling order of two tables."""
    infos = client.server_info(timeout=T)
    state = {
        name: (
            info.current_size,
            info.num_episodes,
            info.num_deleted_episodes,
            info.num_unique_samples,
            info.rate_limiter_info.insert_stats.completed,
            info.rate_limiter_info.sample_stats.completed,
        )
        for name, info in infos.items()
    }
    fifo = [
        (s.info.key, s.data[1].item(), s.data[0].tolist())
        for s in client.sample("fifo", 3, emit_timesteps=False, timeout=T)
    ]
    heap = [
        (s.info.key, s.info.priority, s.info.times_sampled)
        for s in client.sample("heap", 6, emit_timesteps=False, timeout=T)
    ]
    return {"info": state, "fifo": fifo, "heap": heap}


def run_child(script: str, *args: str, timeout: float = 60) -> str:
    out = subprocess.run(
        [sys.executable, "-c", TABLES_SOURCE + textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_restart_in_a_new_process_restores_everything(tmp_path: pathlib.Path) -> None:
    checkpointer = checkpointers.DefaultCheckpointer(str(tmp_path))
    server = reverb.Server(tables(), checkpointer=checkpointer)
    client = server.localhost_client()
    fill(client)
    path = client.checkpoint()
    assert pathlib.Path(path).parent == tmp_path and os.path.isdir(path)
    expected = contents(client)  # (sampling after the checkpoint does not change it)
    server.stop()

    script = """
        import json, sys
        checkpointer = reverb.checkpointers.DefaultCheckpointer(sys.argv[1])
        server = reverb.Server(tables(), checkpointer=checkpointer)
        client = server.localhost_client()
        sys.path.insert(0, sys.argv[2])
        from test_checkpoint import contents
        print(json.dumps(contents(client)))
        """
    import json

    restored = json.loads(run_child(script, str(tmp_path), str(pathlib.Path(__file__).parent)))
    assert restored == json.loads(json.dumps(expected))


def test_rate_limiter_state_is_restored(tmp_path: pathlib.Path) -> None:
    checkpointer = checkpointers.DefaultCheckpointer(str(tmp_path))
    server = reverb.Server(tables(), checkpointer=checkpointer)
    client = server.localhost_client()
    fill(client, steps=12)
    prio = server.in_process_tables["prio"]
    before = [(prio.can_sample(n), prio.can_insert(n)) for n in range(1, 30)]
    client.checkpoint()
    server.stop()
    restored = reverb.Server(tables(), checkpointer=checkpointer)
    prio = restored.in_process_tables["prio"]
    assert [(prio.can_sample(n), prio.can_insert(n)) for n in range(1, 30)] == before
    restored.stop()


def test_server_without_checkpointer_checkpoints_to_a_temp_dir() -> None:
    with reverb.Server([reverb.Table.queue("q", 10)]) as server:
        path = server.localhost_client().checkpoint()
        assert os.path.isdir(path) and "reverb-checkpoints-" in path


def test_old_checkpoints_are_pruned(tmp_path: pathlib.Path) -> None:
    checkpointer = checkpointers.DefaultCheckpointer(str(tmp_path), keep_latest=2)
    with reverb.Server(tables(), checkpointer=checkpointer) as server:
        client = server.localhost_client()
        paths = [client.checkpoint() for _ in range(4)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        os.path.basename(p) for p in paths[-2:]
    )


def test_mismatched_tables_are_refused(tmp_path: pathlib.Path) -> None:
    checkpointer = checkpointers.DefaultCheckpointer(str(tmp_path))
    with reverb.Server(tables(), checkpointer=checkpointer) as server:
        server.localhost_client().checkpoint()
    with pytest.raises(ValueError, match="names must match"):
        reverb.Server([reverb.Table.queue("other", 10)], checkpointer=checkpointer)


def test_smaller_max_size_keeps_the_newest_items(tmp_path: pathlib.Path) -> None:
    checkpointer = checkpointers.DefaultCheckpointer(str(tmp_path))
    with reverb.Server(tables(), checkpointer=checkpointer) as server:
        fill(server.localhost_client())
        server.localhost_client().checkpoint()
    with reverb.Server(tables(max_size=5), checkpointer=checkpointer) as server:
        infos = server.localhost_client().server_info(timeout=T)
        assert infos["fifo"].current_size == 5
        newest = [
            s.data[1].item()
            for s in server.localhost_client().sample("fifo", 1, emit_timesteps=False)
        ]
        assert newest == [25]  # items of steps 25..29 remain; FIFO samples the oldest


def _corrupt_and_expect_error(tmp_path: pathlib.Path, damage) -> None:
    checkpointer = checkpointers.DefaultCheckpointer(str(tmp_path / "root"))
    with reverb.Server(tables(), checkpointer=checkpointer) as server:
        fill(server.localhost_client())
        path = pathlib.Path(server.localhost_client().checkpoint())
    damage(path / "checkpoint.rvb")
    with pytest.raises(ValueError, match="corrupt checkpoint"):
        reverb.Server(tables(), checkpointer=checkpointer)
    # With a fallback, the server starts from it instead.
    fallback_root = tmp_path / "fallback"
    with reverb.Server(
        tables(), checkpointer=checkpointers.DefaultCheckpointer(str(fallback_root))
    ) as server:
        server.localhost_client().insert(np.int64(5), {"fifo": 1.0})
        fallback = server.localhost_client().checkpoint()
    with_fallback = checkpointers.DefaultCheckpointer(
        str(tmp_path / "root"), fallback_checkpoint_path=fallback
    )
    with reverb.Server(tables(), checkpointer=with_fallback) as server:
        assert server.localhost_client().server_info(timeout=T)["fifo"].current_size == 1


def test_truncated_checkpoint_is_reported(tmp_path: pathlib.Path) -> None:
    def truncate(file: pathlib.Path) -> None:
        data = file.read_bytes()
        file.write_bytes(data[: len(data) * 2 // 3])

    _corrupt_and_expect_error(tmp_path, truncate)


def test_flipped_bit_is_reported(tmp_path: pathlib.Path) -> None:
    def flip(file: pathlib.Path) -> None:
        data = bytearray(file.read_bytes())
        data[len(data) // 2] ^= 0x10
        file.write_bytes(bytes(data))

    _corrupt_and_expect_error(tmp_path, flip)


def test_kill_during_checkpoint_leaves_the_previous_one_loadable(tmp_path: pathlib.Path) -> None:
    # A child fills ~300 MB, checkpoints once (small), then again (big) and is killed -9 while
    # the second checkpoint is being written.
    script = """
        import sys, numpy as np, reverb
        root = sys.argv[1]
        checkpointer = reverb.checkpointers.DefaultCheckpointer(root, keep_latest=5)
        server = reverb.Server(tables(), checkpointer=checkpointer)
        client = server.localhost_client()
        client.insert(np.int64(1), {"fifo": 1.0})
        client.checkpoint()
        with client.trajectory_writer(1) as writer:
            rng = np.random.default_rng(0)
            for i in range(60):
                writer.append({"big": rng.integers(0, 255, 5_000_000, dtype=np.uint8)})
                writer.create_item("fifo", 1.0, writer.history["big"][-1])
        print("filled", flush=True)
        client.checkpoint()
        print("second checkpoint finished", flush=True)
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", TABLES_SOURCE + textwrap.dedent(script), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "filled"
        # (Polled often: the kill must land while the checkpoint is being written.)
        wait_for(
            lambda: any(p.name.startswith(".tmp-") for p in tmp_path.iterdir()),
            30,
            "the second checkpoint to start",
            interval=0.001,
        )
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.communicate(timeout=30)
    published = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert len(published) == 1, "only the first checkpoint was published"
    with reverb.Server(
        tables(), checkpointer=checkpointers.DefaultCheckpointer(str(tmp_path))
    ) as server:
        info = server.localhost_client().server_info(timeout=T)["fifo"]
        assert info.current_size == 1
        (step,) = next(server.localhost_client().sample("fifo", timeout=T))
        assert step.data[0] == 1


def test_checkpoint_while_writers_and_samplers_run(tmp_path: pathlib.Path) -> None:
    checkpointer = checkpointers.DefaultCheckpointer(str(tmp_path), keep_latest=10)
    table = reverb.Table(
        "t", selectors.Uniform(), selectors.Fifo(), 10_000, rate_limiters.MinSize(1)
    )
    server = reverb.Server([table], checkpointer=checkpointer)
    address = f"localhost:{server.port}"
    stop = threading.Event()
    errors: list = []

    def write() -> None:
        try:
            with reverb.Client(address).trajectory_writer(2) as writer:
                t = 0
                while not stop.is_set():
                    writer.append({"x": np.full(100, t, np.int32)})
                    if t:
                        writer.create_item("t", 1.0, writer.history["x"][-2:])
                    t += 1
        except Exception as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    def sample() -> None:
        try:
            client = reverb.Client(address)
            while not stop.is_set():
                samples = list(client.sample("t", 20, emit_timesteps=False, timeout=T))
                assert len(samples) == 20
                for s in samples:
                    assert s.data[0][1][0] == s.data[0][0][0] + 1
        except Exception as e:  # noqa: BLE001 - asserted below
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(2)]
    threads += [threading.Thread(target=sample) for _ in range(2)]
    for thread in threads:
        thread.start()
    client = reverb.Client(address)

    def counts() -> tuple:
        stats = client.server_info(timeout=T)["t"].rate_limiter_info
        return stats.insert_stats.completed, stats.sample_stats.completed

    def went_on(since: tuple) -> bool:
        inserts, samples = counts()
        return inserts >= since[0] + 100 and samples >= since[1] + 100

    wait_for(lambda: went_on((0, 0)), T, "the writers and samplers to get going", failures=errors)
    paths = []
    for _ in range(3):
        before = counts()
        paths.append(client.checkpoint(timeout=T))
        # The next checkpoint is taken after both went on.
        wait_for(
            lambda before=before: went_on(before),
            T,
            "inserts and samples after a checkpoint",
            failures=errors,
        )
    stop.set()
    for thread in threads:
        thread.join(T)
    assert not errors
    server.stop()
    # The last checkpoint restores a consistent table: every item is a valid 2-step window.
    with reverb.Server(
        [table.replace()], checkpointer=checkpointers.DefaultCheckpointer(str(tmp_path))
    ) as restored:
        c = restored.localhost_client()
        size = c.server_info(timeout=T)["t"].current_size
        assert size > 0
        samples = list(c.sample("t", 50, emit_timesteps=False, timeout=T))
        assert len(samples) == 50
        for s in samples:
            assert s.data[0][1][0] == s.data[0][0][0] + 1


def test_the_references_checkpointer_paths_restore_a_checkpoint(tmp_path: pathlib.Path) -> None:
    # As code written for Reverb 0.14 (e.g. TF-Agents' examples) restores: through
    # reverb.platform.checkpointers_lib, from the parent of a checkpoint's path.
    from reverb.platform import checkpointers_lib
    from reverb.platform.default import checkpointers as default_checkpointers

    assert reverb.checkpointers.DefaultCheckpointer is checkpointers_lib.DefaultCheckpointer
    assert default_checkpointers.CheckpointerBase is checkpointers.CheckpointerBase
    assert isinstance(
        default_checkpointers.default_checkpointer(), checkpointers_lib.CheckpointerBase
    )
    first = checkpointers_lib.DefaultCheckpointer(path=str(tmp_path / "replay"))
    with reverb.Server(tables(), checkpointer=first) as server:
        fill(server.localhost_client())
        checkpoint_path = server.localhost_client().checkpoint()
        saved = contents(server.localhost_client())  # (sampling changes the tables)
    again = checkpointers_lib.DefaultCheckpointer(path=checkpoint_path.rsplit("/", 1)[0])
    with reverb.Server(tables(), checkpointer=again) as server:
        assert contents(server.localhost_client()) == saved


def test_the_references_checkpointer_paths_are_there_after_a_plain_import() -> None:
    # TF-Agents' examples call reverb.platform.checkpointers_lib.DefaultCheckpointer right
    # after `import reverb` (a fresh process: this one imported the modules already).
    code = (
        "import sys, reverb\n"
        "from reverb import checkpointers\n"
        "p = reverb.platform\n"
        "assert p.checkpointers_lib.DefaultCheckpointer is checkpointers.DefaultCheckpointer\n"
        "assert p.default.checkpointers.DefaultCheckpointer is checkpointers.DefaultCheckpointer\n"
        "assert p.default.checkpointers.checkpointers_lib is p.checkpointers_lib\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_only_the_servers_own_checkpoints_are_pruned_and_loaded(tmp_path: pathlib.Path) -> None:
    """Regression: a `backup/` holding a checkpoint under the root sorted after our
    timestamps, so every new checkpoint was pruned right after it was written and a restart
    loaded the backup; and any `.tmp-*` entry was deleted."""
    checkpointer = checkpointers.DefaultCheckpointer(str(tmp_path), keep_latest=1)
    with reverb.Server(tables(), checkpointer=checkpointer) as server:
        client = server.localhost_client()
        client.insert(np.int32(1), {"fifo": 1.0}, timeout=10)
        backup = pathlib.Path(client.checkpoint())
    backup.rename(tmp_path / "backup")  # holds one item
    (tmp_path / ".tmp-notes.txt").write_text("the user's")
    (tmp_path / ".tmp-dir").mkdir()
    with reverb.Server(tables(), checkpointer=checkpointer) as server:
        client = server.localhost_client()
        for value in (2, 3):
            client.insert(np.int32(value), {"fifo": 1.0}, timeout=10)
        latest = pathlib.Path(client.checkpoint())
        assert latest.exists()  # not pruned
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["backup", ".tmp-notes.txt", ".tmp-dir", latest.name])
    # A restart loads the server's own latest checkpoint (two items), not the backup.
    with reverb.Server(tables(), checkpointer=checkpointer) as server:
        info = server.localhost_client().server_info(timeout=10)
        assert info["fifo"].current_size == 2
