"""`reverb.ray_servers`: shards started as Ray actors on a local Ray cluster, used through a
`ShardedClient`, checkpointed, one killed and restarted from its checkpoint, then stopped."""

from __future__ import annotations

import numpy as np
import pytest
from _wait import wait_for
from conftest import CALL_TIMEOUT

import reverb

ray = pytest.importorskip("ray")

# Starting the local Ray cluster (module fixture) alone takes several seconds.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def local_ray():
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        object_store_memory=100 * 1024 * 1024,
    )
    yield
    ray.shutdown()


def test_shards_as_ray_actors_end_to_end(local_ray, tmp_path) -> None:
    from reverb import ray_servers

    def make_tables():
        return [
            reverb.Table(
                "replay",
                reverb.selectors.Uniform(),
                reverb.selectors.Fifo(),
                1000,
                reverb.rate_limiters.MinSize(1),
            )
        ]

    shards = ray_servers.start(3, make_tables, checkpoint_root=str(tmp_path), timeout=120)
    try:
        assert len(set(shards.addresses)) == 3
        client = shards.client()
        with client.trajectory_writer(2) as writer:
            for episode in range(6):
                for step in range(4):
                    writer.append({"x": np.int64(episode * 10 + step)})
                    if step:
                        writer.create_item("replay", 1.0, {"x": writer.history["x"][-2:]})
                writer.end_episode(timeout_ms=int(CALL_TIMEOUT * 1000))
        sizes = [i["replay"].current_size for i in client.shard_info(timeout=CALL_TIMEOUT)]
        assert sizes == [6, 6, 6]  # two episodes of three items per shard
        paths = shards.checkpoint(timeout=CALL_TIMEOUT)
        assert [p.startswith(str(tmp_path / f"shard-{i}")) for i, p in enumerate(paths)] == [
            True
        ] * 3
        samples = list(client.sample("replay", 30, emit_timesteps=False, timeout=CALL_TIMEOUT))
        assert {s.info.table_size for s in samples} == {18}
        # Items written after the checkpoint are lost with the shard that dies; the
        # checkpointed ones come back with its new actor, at the same address.
        client.shards[1].insert(np.arange(2, dtype=np.int64), {"replay": 1.0}, timeout=10)
        address = shards.addresses[1]
        ray.kill(shards._actors[1], no_restart=True)
        # (The kill takes effect asynchronously.)
        wait_for(lambda: shards.dead() == [1], 30, "the killed shard to be reported dead")
        # (Ray reports the actor dead before its process has gone.)
        wait_for(
            lambda: isinstance(client.shard_info(timeout=2)[1], reverb.errors.ReverbError),
            30,
            "the killed shard to stop answering",
        )
        # Sampling goes on from the others meanwhile.
        samples = list(client.sample("replay", 20, emit_timesteps=False, timeout=CALL_TIMEOUT))
        assert {s.info.table_size for s in samples} == {12}
        assert shards.restart_dead() == [1]
        assert shards.addresses[1] == address
        assert shards.dead() == []
        sizes = [i["replay"].current_size for i in client.shard_info(timeout=CALL_TIMEOUT)]
        assert sizes == [6, 6, 6]
        with reverb.TrajectoryIterator(
            shards.addresses, "replay", batch_size=18, max_samples=36
        ) as it:
            batches = list(it)
        assert sum(len(b.info.key) for b in batches) == 36
    finally:
        shards.stop()
    wait_for(lambda: shards.dead() == [0, 1, 2], 30, "stopped shards to be reported dead")


def test_start_checks_its_arguments(local_ray) -> None:
    from reverb import ray_servers

    with pytest.raises(ValueError, match="num_shards"):
        ray_servers.start(0, list)
    with pytest.raises(TypeError, match="make_tables"):
        ray_servers.start(1, "tables")
    with pytest.raises(RuntimeError, match="could not place"):
        ray_servers.start(2, list, num_cpus=3, placement_strategy="STRICT_PACK", timeout=2)


def test_a_shard_whose_process_dies_comes_back_on_its_own(local_ray, tmp_path) -> None:
    """Ray restarts the killed shard's actor (max_restarts), on the same port, and the new
    server restores the shard's checkpoint: clients carry on at the same address."""
    import os
    import signal

    from reverb import ray_servers

    def make_tables():
        return [reverb.Table.queue("q", 100)]

    shards = ray_servers.start(2, make_tables, checkpoint_root=str(tmp_path), timeout=120)
    try:
        client = shards.client()
        for shard in client.shards:
            shard.insert(np.arange(3, dtype=np.int64), {"q": 1.0}, timeout=10)
        shards.checkpoint(timeout=CALL_TIMEOUT)
        address = shards.addresses[1]
        pid = ray.get(shards._actors[1].pid.remote(), timeout=30)
        os.kill(pid, signal.SIGKILL)

        def back() -> bool:
            try:
                return ray.get(shards._actors[1].pid.remote(), timeout=30) != pid
            except ray.exceptions.RayError:
                return False  # dead or restarting

        wait_for(back, 60, "Ray to restart the shard's actor")
        shard = reverb.Client(address)
        wait_for(
            lambda: not isinstance(client.shard_info(timeout=2)[1], reverb.errors.ReverbError),
            30,
            "the restarted shard to serve at its old address",
        )
        assert shard.server_info(timeout=CALL_TIMEOUT)["q"].current_size == 1
        assert shards.addresses[1] == address and shards.dead() == []
        [[sample]] = shard.sample("q", num_samples=1, timeout=CALL_TIMEOUT)
        assert sample.data[0].tolist() == [0, 1, 2]
    finally:
        shards.stop()
