"""Replay servers as Ray actors: the shards of one replay, deployed on a Ray cluster.

    import reverb.ray_servers

    def make_tables():
        return [reverb.Table('replay', reverb.selectors.Prioritized(0.6), ...)]

    shards = reverb.ray_servers.start(4, make_tables, checkpoint_root='/shared/replay')
    client = shards.client()          # a reverb.ShardedClient over the shards
    ...
    shards.stop()

A shard whose process dies comes back on its own: Ray restarts its actor (up to
`max_restarts` times, by default without limit) and the new server restores the shard's
latest checkpoint. While its node lives it comes back on the same node and port, so its
address does not change and clients carry on; when Ray has to move it to another node (its
node died), it serves wherever it can: `shards.update_addresses()` finds the new address and
`shards.client()` then uses it. `shards.restart_dead()` starts a new actor by hand for a shard
Ray gave up on (or one started with `max_restarts=0`).

Not in the reference. Needs Ray (`pip install '.[ray]'`); `ray.init` is the caller's. Each
shard is one actor holding one `reverb.Server`; by default the actors go to the bundles of a
placement group with the `SPREAD` strategy (one bundle of `num_cpus` CPUs per shard), so they
land on different nodes when there are several. A restarted shard goes to the same bundle (so
the same node) and port, so its address does not change and clients carry on.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray
from ray.experimental import internal_kv
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

import reverb
from reverb import checkpointers, sharded_client

TableFactory = Callable[[], Sequence[reverb.Table]]


class ShardServer:
    """One shard: a `reverb.Server` of the factory's tables, in a Ray actor. Restores the
    latest checkpoint in `checkpoint_dir` (if any) when it starts. Its port goes to Ray's
    key-value store under `port_key`, so that the actor Ray restarts after a crash (with the
    same arguments) serves on the same port."""

    def __init__(
        self,
        make_tables: TableFactory,
        port: Optional[int],
        checkpoint_dir: Optional[str],
        server_args: Dict[str, Any],
        port_key: Optional[str] = None,
    ) -> None:
        saved = None
        if port is None and port_key is not None:
            value = internal_kv._internal_kv_get(port_key)
            saved = int(value) if value else None
        checkpointer = None
        if checkpoint_dir is not None:
            checkpointer = checkpointers.DefaultCheckpointer(checkpoint_dir)
        try:
            self._server = reverb.Server(
                list(make_tables()), port=port or saved, checkpointer=checkpointer, **server_args
            )
        except OSError:
            if saved is None:
                raise
            # The old port is taken (or this is another node): serve on any port; the
            # driver finds the new address with `RayShards.update_addresses`.
            self._server = reverb.Server(
                list(make_tables()), checkpointer=checkpointer, **server_args
            )
        if port_key is not None:
            internal_kv._internal_kv_put(port_key, str(self._server.port), overwrite=True)
        self._host = ray.util.get_node_ip_address()

    def address(self) -> str:
        """`host:port` of the server, as other nodes reach it."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{host}:{self._server.port}"

    def port(self) -> int:
        """The server's port."""
        return self._server.port

    def ping(self) -> bool:
        """True (the actor is alive)."""
        return True

    def pid(self) -> int:
        """The actor's process id."""
        return os.getpid()

    def stop(self) -> None:
        """Stops the server."""
        self._server.stop()


class RayShards:
    """Running shards (see `start`): their addresses, a client over them, checkpoints,
    restarts and stop."""

    def __init__(
        self,
        make_tables: TableFactory,
        checkpoint_root: Optional[str],
        actor_options: Dict[str, Any],
        server_args: Dict[str, Any],
        group: Any,
        num_shards: int,
        timeout: float,
    ) -> None:
        self._make_tables = make_tables
        self._checkpoint_root = checkpoint_root
        self._actor_options = actor_options
        self._server_args = server_args
        self._group = group
        self._timeout = timeout
        self._actors: List[Any] = [None] * num_shards
        self._ports: List[Optional[int]] = [None] * num_shards
        # Where each shard's actor keeps its port across Ray's restarts of it.
        self._port_keys = [f"reverb-shard-port/{uuid.uuid4().hex}/{i}" for i in range(num_shards)]
        self.addresses: List[str] = [""] * num_shards
        try:
            for shard in range(num_shards):
                self._start(shard)
        except BaseException:
            for actor in self._actors:
                if actor is not None:
                    ray.kill(actor, no_restart=True)
            self._forget_ports()
            raise

    def _forget_ports(self) -> None:
        for key in self._port_keys:
            try:
                internal_kv._internal_kv_del(key)
            except Exception:  # (the cluster may be gone already)
                pass

    def _checkpoint_dir(self, shard: int) -> Optional[str]:
        if self._checkpoint_root is None:
            return None
        return os.path.join(self._checkpoint_root, f"shard-{shard}")

    def _start(self, shard: int) -> None:
        options = dict(self._actor_options)
        if self._group is not None:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                self._group, placement_group_bundle_index=shard
            )
        actor = (
            ray.remote(ShardServer)
            .options(**options)
            .remote(
                self._make_tables,
                self._ports[shard],
                self._checkpoint_dir(shard),
                self._server_args,
                self._port_keys[shard],
            )
        )
        self._actors[shard] = actor
        try:
            address = ray.get(actor.address.remote(), timeout=self._timeout)
        except BaseException:
            # (E.g. a checkpoint too big to restore in time: it must not come up later.)
            ray.kill(actor, no_restart=True)
            raise
        self._ports[shard] = int(address.rsplit(":", 1)[1])
        self.addresses[shard] = address

    def update_addresses(self) -> List[int]:
        """Asks every live shard its address (a shard Ray restarted on another node has a
        new one) and returns the shards whose address changed; `client()` uses the new ones
        (clients made before keep the old)."""
        changed = []
        for shard, actor in enumerate(self._actors):
            try:
                address = ray.get(actor.address.remote(), timeout=self._timeout)
            except ray.exceptions.RayError:
                continue  # dead or restarting: asked again next time
            if address != self.addresses[shard]:
                self._ports[shard] = int(address.rsplit(":", 1)[1])
                self.addresses[shard] = address
                changed.append(shard)
        return changed

    def client(self, **kwargs: Any) -> sharded_client.ShardedClient:
        """A `reverb.ShardedClient` over the shards (arguments as its own)."""
        if "auth_token" not in kwargs and "auth_token" in self._server_args:
            kwargs["auth_token"] = self._server_args["auth_token"]
        return sharded_client.ShardedClient(self.addresses, **kwargs)

    def checkpoint(self, timeout: Optional[float] = None) -> List[str]:
        """Checkpoints every shard (into `checkpoint_root/shard-<i>`); returns the paths."""
        return self.client().checkpoint(timeout=timeout)

    def dead(self) -> List[int]:
        """The shards whose actor has died (asked at once; a shard that is only slow or out
        of reach for a moment is not dead)."""
        pings = [actor.ping.remote() for actor in self._actors]
        ray.wait(pings, num_returns=len(pings), timeout=self._timeout)
        dead = []
        for shard, ping in enumerate(pings):
            try:
                ray.get(ping, timeout=0)
            except ray.exceptions.ActorUnavailableError:
                pass  # alive, unreachable for now
            except ray.exceptions.RayActorError:
                dead.append(shard)
            except ray.exceptions.GetTimeoutError:
                pass  # slow, not dead
        return dead

    def restart_dead(self) -> List[int]:
        """Starts a new actor for each dead shard (one Ray no longer restarts), in its bundle
        and on its port, from its latest checkpoint (empty without `checkpoint_root`);
        returns their indices."""
        dead = self.dead()
        for shard in dead:
            ray.kill(self._actors[shard], no_restart=True)
            self._start(shard)
        return dead

    def stop(self) -> None:
        """Stops every shard and releases the placement group."""
        for actor in self._actors:
            try:
                ray.get(actor.stop.remote(), timeout=self._timeout)
            except ray.exceptions.RayError:
                pass  # dead already
            ray.kill(actor, no_restart=True)
        self._forget_ports()
        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None


def start(
    num_shards: int,
    make_tables: TableFactory,
    *,
    checkpoint_root: Optional[str] = None,
    num_cpus: float = 1,
    resources: Optional[Dict[str, float]] = None,
    placement_strategy: Optional[str] = "SPREAD",
    server_args: Optional[Dict[str, Any]] = None,
    max_restarts: int = -1,
    timeout: float = 60.0,
) -> RayShards:
    """Starts `num_shards` replay servers as Ray actors, each with the tables `make_tables()`
    returns, and returns them once every one serves.

    Each actor asks for `num_cpus` CPUs and `resources` (Ray custom resources, e.g. a node
    label); with `placement_strategy` ("SPREAD", "STRICT_SPREAD", "PACK", "STRICT_PACK") they
    go to the bundles of one placement group, else wherever Ray puts them. With
    `checkpoint_root` (a directory every node can reach), shard i checkpoints into
    `checkpoint_root/shard-<i>` and restores from there when it (re)starts. Ray restarts a
    shard whose process died up to `max_restarts` times (-1: always, as Ray Serve restarts
    its replicas, so a shard that cannot start, e.g. out of memory while restoring, keeps
    being restarted; 0: never, see `RayShards.restart_dead`), on the same port while its
    node lives (see `RayShards.update_addresses`). `server_args` go to `reverb.Server` (e.g.
    `auth_token`). Ray calls wait at most `timeout` seconds.
    """
    if not 1 <= num_shards <= sharded_client.MAX_SHARDS:
        raise ValueError(f"num_shards ({num_shards}) must be in [1, {sharded_client.MAX_SHARDS}]")
    if not callable(make_tables):
        raise TypeError("make_tables must be a function returning the shard's tables")
    if not ray.is_initialized():
        raise RuntimeError("Ray is not initialized: call ray.init() first")
    bundle: Dict[str, float] = {"CPU": float(num_cpus), **(resources or {})}
    actor_options: Dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": max_restarts}
    if resources:
        actor_options["resources"] = dict(resources)
    group = None
    if placement_strategy is not None:
        group = placement_group([dict(bundle) for _ in range(num_shards)], placement_strategy)
        try:
            ray.get(group.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            raise RuntimeError(
                f"Ray could not place {num_shards} shards of {bundle} with strategy "
                f"{placement_strategy} within {timeout} s"
            ) from None
    try:
        return RayShards(
            make_tables,
            checkpoint_root,
            actor_options,
            dict(server_args or {}),
            group,
            num_shards,
            timeout,
        )
    except BaseException:
        if group is not None:
            remove_placement_group(group)
        raise


__all__ = ["RayShards", "ShardServer", "start"]
