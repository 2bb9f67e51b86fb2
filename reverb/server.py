"""`Server`, `Table` and `TableExtensionBase` (module layout of Reverb 0.14)."""

from __future__ import annotations

import abc
import os
from typing import Any, Optional, Sequence, Union

from reverb import (
    _native,
    _signature,
    checkpointers,
    item_selectors,
    pybind,
    rate_limiters,
    reverb_types,
)
from reverb import client as client_lib
from reverb import storage as storage_lib


class TableExtensionBase(metaclass=abc.ABCMeta):
    """Base class of table extensions (kept for API compatibility; none ship yet)."""

    @abc.abstractmethod
    def build_internal_extensions(self, table_name: str) -> Sequence[Any]:
        """Builds the native extensions for a table."""


class Table:
    """A table of items: sampler, remover, max size, rate limiter and optional signature.

    The table exists (and can be inspected) before a `Server` serves it.
    """

    def __init__(
        self,
        name: str,
        sampler: item_selectors.ItemSelector,
        remover: item_selectors.ItemSelector,
        max_size: int,
        rate_limiter: rate_limiters.RateLimiter,
        max_times_sampled: int = 0,
        extensions: Sequence[TableExtensionBase] = (),
        signature: Optional[reverb_types.SpecNest] = None,
    ) -> None:
        if not name:
            raise ValueError("Table name must be a non-empty string")
        if max_size <= 0:
            raise ValueError(f"max_size ({max_size}) must be a positive integer")
        if not isinstance(sampler, item_selectors.ItemSelector):
            raise TypeError(f"sampler must be a reverb.selectors selector, got {sampler!r}")
        if not isinstance(remover, item_selectors.ItemSelector):
            raise TypeError(f"remover must be a reverb.selectors selector, got {remover!r}")
        if not isinstance(rate_limiter, rate_limiters.RateLimiter):
            raise TypeError(
                f"rate_limiter must be a reverb.rate_limiters limiter, got {rate_limiter!r}"
            )
        if extensions:
            raise ValueError("Table extensions are not supported by this implementation")
        self._name = name
        self._sampler = sampler
        self._remover = remover
        self._max_size = int(max_size)
        self._rate_limiter = rate_limiter
        self._max_times_sampled = int(max_times_sampled)
        self._signature = signature
        self.internal_table = _native.Table(
            name=name,
            sampler=sampler._native(),
            remover=remover._native(),
            max_size=self._max_size,
            max_times_sampled=self._max_times_sampled,
            rate_limiter=rate_limiter._native(),
            signature=_signature.encode(signature),
        )

    @classmethod
    def queue(
        cls,
        name: str,
        max_size: int,
        extensions: Sequence[TableExtensionBase] = (),
        signature: Optional[reverb_types.SpecNest] = None,
    ) -> Table:
        """A FIFO queue: items are sampled once, in insertion order; inserts block when full."""
        return cls._sampled_once(
            name,
            max_size,
            item_selectors.Fifo(),
            rate_limiters.Queue(max_size),
            extensions,
            signature,
        )

    @classmethod
    def stack(
        cls,
        name: str,
        max_size: int,
        extensions: Sequence[TableExtensionBase] = (),
        signature: Optional[reverb_types.SpecNest] = None,
    ) -> Table:
        """A LIFO stack: items are sampled once, newest first; inserts block when full."""
        return cls._sampled_once(
            name,
            max_size,
            item_selectors.Lifo(),
            rate_limiters.Stack(max_size),
            extensions,
            signature,
        )

    @classmethod
    def _sampled_once(
        cls,
        name: str,
        max_size: int,
        selector: item_selectors.ItemSelector,
        rate_limiter: rate_limiters.RateLimiter,
        extensions: Sequence[TableExtensionBase],
        signature: Optional[reverb_types.SpecNest],
    ) -> Table:
        """A table whose items are sampled once, with `selector` as sampler and remover."""
        return cls(
            name=name,
            sampler=selector,
            remover=selector,
            max_size=max_size,
            max_times_sampled=1,
            rate_limiter=rate_limiter,
            extensions=extensions,
            signature=signature,
        )

    @property
    def name(self) -> str:
        """The table's name."""
        return self._name

    @property
    def info(self) -> reverb_types.TableInfo:
        """Current size, counters and settings."""
        return reverb_types.TableInfo.from_serialized_proto(self.internal_table.info())

    def can_sample(self, num_samples: int) -> bool:
        """Whether the rate limiter allows `num_samples` samples now."""
        return self.internal_table.can_sample(num_samples)

    def can_insert(self, num_inserts: int) -> bool:
        """Whether the rate limiter allows `num_inserts` inserts now."""
        return self.internal_table.can_insert(num_inserts)

    def replace(
        self,
        name: Optional[str] = None,
        sampler: Optional[item_selectors.ItemSelector] = None,
        remover: Optional[item_selectors.ItemSelector] = None,
        max_size: Optional[int] = None,
        rate_limiter: Optional[rate_limiters.RateLimiter] = None,
        max_times_sampled: Optional[int] = None,
        extensions: Optional[Sequence[TableExtensionBase]] = None,
        signature: Optional[reverb_types.SpecNest] = None,
    ) -> Table:
        """A new, empty table with the given settings changed and the rest copied."""
        return type(self)(
            name=self._name if name is None else name,
            sampler=self._sampler if sampler is None else sampler,
            remover=self._remover if remover is None else remover,
            max_size=self._max_size if max_size is None else max_size,
            rate_limiter=self._rate_limiter if rate_limiter is None else rate_limiter,
            max_times_sampled=(
                self._max_times_sampled if max_times_sampled is None else max_times_sampled
            ),
            extensions=() if extensions is None else extensions,
            signature=self._signature if signature is None else signature,
        )

    def __repr__(self) -> str:
        return (
            f"Table(name={self._name!r}, sampler={self._sampler!r}, remover={self._remover!r}, "
            f"max_size={self._max_size}, max_times_sampled={self._max_times_sampled}, "
            f"rate_limiter={self._rate_limiter!r}, signature={self._signature!r})"
        )


def _path(path: Optional[client_lib.PathLike]) -> Optional[str]:
    return None if path is None else os.fspath(path)


class Server:
    """A Reverb gRPC server serving `tables` on `port` (a free port when None).

    Not in the reference: `host` is the address to listen on (every interface when None, as
    the reference does); with `auth_token` (by default the `REVERB_AUTH_TOKEN` environment
    variable, when set) only calls carrying that token are served, others get
    UNAUTHENTICATED and change nothing. With `metrics_port` (0: a free one, see
    `.metrics_port`) it serves Prometheus metrics over HTTP there (`/metrics`); with
    `log_stats_every` (seconds) it writes one line per table to stderr that often. With
    `tls_cert` and `tls_key` (PEM files) it serves TLS only; with `tls_client_ca` as well,
    only to clients presenting a certificate that authority signed (mutual TLS). By default
    the `REVERB_TLS_CERT`, `REVERB_TLS_KEY` and `REVERB_TLS_CLIENT_CA` variables. With
    `storage` (a `reverb.DiskStorage`, or a directory) chunk data is kept on disk behind a
    bounded cache, for tables larger than memory (see `reverb.storage`).
    """

    def __init__(
        self,
        tables: Optional[Sequence[Table]] = None,
        port: Optional[int] = None,
        checkpointer: Optional[checkpointers.CheckpointerBase] = None,
        *,
        host: Optional[str] = None,
        auth_token: Optional[str] = None,
        metrics_port: Optional[int] = None,
        log_stats_every: Optional[float] = None,
        tls_cert: Optional[client_lib.PathLike] = None,
        tls_key: Optional[client_lib.PathLike] = None,
        tls_client_ca: Optional[client_lib.PathLike] = None,
        storage: Union[None, client_lib.PathLike, storage_lib.DiskStorage] = None,
    ) -> None:
        disk = storage_lib.disk_storage(storage)
        if not tables:
            raise ValueError("At least one table must be provided")
        names = [t.name for t in tables]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"Multiple items in tables have the same name: {', '.join(duplicates)}"
            )
        if checkpointer is None:
            checkpointer = checkpointers.default_checkpointer()
        if not isinstance(checkpointer, checkpointers.CheckpointerBase):
            raise TypeError(f"checkpointer must be a CheckpointerBase, got {checkpointer!r}")
        internal = checkpointer.internal_checkpointer()
        if not isinstance(internal, pybind.Checkpointer):
            raise TypeError(
                f"{type(checkpointer).__name__}.internal_checkpointer() must return a "
                f"reverb.pybind.Checkpointer, got {internal!r}"
            )
        root, fallback, keep_latest = (
            internal.path,
            internal.fallback_checkpoint_path,
            internal.keep_latest,
        )
        if port is not None and not 0 <= int(port) < 65536:
            raise ValueError(f"port ({port}) must be in [0, 65535]")
        self._tables = list(tables)
        self._checkpointer = checkpointer
        # Restores the latest checkpoint (if any) before serving; ValueError if it does not fit.
        self._server = _native.Server(
            [t.internal_table for t in tables],
            port=int(port or 0),
            checkpoint_root=root,
            fallback_checkpoint_path=fallback,
            keep_latest=keep_latest,
            host=host,
            auth_token=auth_token,
            metrics_port=None if metrics_port is None else int(metrics_port),
            log_stats_every=log_stats_every,
            tls_cert=_path(tls_cert),
            tls_key=_path(tls_key),
            tls_client_ca=_path(tls_client_ca),
            storage_dir=None if disk is None else os.fspath(disk.directory),
            cache_bytes=storage_lib.DEFAULT_CACHE_BYTES if disk is None else disk.cache_bytes,
            sync_interval=1.0 if disk is None else disk.native_sync()[0],
            sync_always=False if disk is None else disk.native_sync()[1],
        )
        self._storage = disk
        self._port = self._server.port
        self._host = host
        self._auth_token = auth_token

    @property
    def port(self) -> int:
        """The port being served."""
        return self._port

    @property
    def metrics_port(self) -> Optional[int]:
        """The port Prometheus metrics are served on (None without `metrics_port`)."""
        return self._server.metrics_port

    @property
    def in_process_tables(self) -> dict:
        """The served tables by name (the same objects passed in)."""
        return {t.name: t for t in self._tables}

    def stop(self) -> None:
        """Stops serving. Safe to call more than once."""
        if getattr(self, "_server", None) is not None:
            self._server.stop()

    def wait(self) -> None:
        """Blocks until the server stops; Ctrl-C raises KeyboardInterrupt."""
        self._server.wait()

    def localhost_client(self) -> client_lib.Client:
        """A client of this server through localhost (or the host it listens on), with its
        auth token."""
        host = self._host if self._host not in (None, "", "0.0.0.0", "::") else "localhost"
        if ":" in host:
            host = f"[{host}]"
        return client_lib.Client(f"{host}:{self._port}", auth_token=self._auth_token)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __del__(self) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Server(port={self._port}, tables={[t.name for t in self._tables]})"
