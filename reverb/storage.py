"""Where a server keeps its tables (not in the reference): in memory (the default) or on disk,
chunk data behind a cache bounded in bytes (tables larger than memory) and every change
journaled (tables that survive a crash).

    server = reverb.Server(tables, port=8000,
                           storage=reverb.DiskStorage("/var/lib/reverb/data",
                                                      cache_bytes=4 << 30))

With `DiskStorage`, each chunk's payload is written to a log of segment files in
`directory` when it arrives and read back through the cache when sampled; the items
(keys, priorities, selector state) and small payloads stay in memory, and every change of
the tables (inserts, priority updates, deletes) goes to a journal in the directory, synced
every `sync_interval` seconds. A server started on the directory again (after a stop or a
crash) serves what it held: every item whose insert was confirmed more than `sync_interval`
before, with its data and priority. With `sync_interval="always"`, inserts are confirmed only
once on disk (one sync serves every insert waiting at once). One server holds a directory at
a time.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Union

PathLike = Union[str, "os.PathLike[str]"]

#: The cache's default bound in bytes.
DEFAULT_CACHE_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class DiskStorage:
    """Chunk payloads on disk under `directory` (created if missing), read back through a
    cache of at most `cache_bytes` payload bytes; the tables' changes journaled there, synced
    every `sync_interval` seconds (`"always"`: before each insert is confirmed)."""

    directory: PathLike
    cache_bytes: int = DEFAULT_CACHE_BYTES
    sync_interval: Union[float, str] = 1.0

    def __post_init__(self) -> None:
        if not os.fspath(self.directory):
            raise ValueError("DiskStorage needs a directory")
        if isinstance(self.cache_bytes, bool) or not isinstance(self.cache_bytes, int):
            raise TypeError(f"cache_bytes must be an int, got {self.cache_bytes!r}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {self.cache_bytes}")
        interval = self.sync_interval
        number = isinstance(interval, (int, float)) and not isinstance(interval, bool)
        if not (interval == "always" or (number and 0 < interval < 1e9)):
            raise ValueError(
                f'sync_interval must be a positive number of seconds or "always", got {interval!r}'
            )

    def native_sync(self) -> tuple:
        """(sync_interval in seconds, sync_always) as the server takes them."""
        if self.sync_interval == "always":
            return 1.0, True
        return float(self.sync_interval), False


def disk_storage(storage: Union[None, PathLike, DiskStorage]) -> Union[None, DiskStorage]:
    """`storage` as a `DiskStorage` (a path means one there with the default cache), or None
    for memory."""
    if storage is None or isinstance(storage, DiskStorage):
        return storage
    if isinstance(storage, (str, os.PathLike)):
        return DiskStorage(storage)
    raise TypeError(f"storage must be a DiskStorage or a directory, got {storage!r}")
