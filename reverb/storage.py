"""Where a server keeps its chunks' data (not in the reference): in memory (the default) or on
disk behind a cache bounded in bytes, for tables larger than memory.

    server = reverb.Server(tables, port=8000,
                           storage=reverb.DiskStorage("/var/lib/reverb/chunks",
                                                      cache_bytes=4 << 30))

With `DiskStorage`, each chunk's payload is written to a log of segment files in
`directory` when it arrives and read back through the cache when sampled; the items
(keys, priorities, selector state) and small payloads stay in memory. One server holds a
directory at a time. What the directory held before the server started is dropped: items are
not yet kept across restarts (restore them from a checkpoint).
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
    cache of at most `cache_bytes` payload bytes."""

    directory: PathLike
    cache_bytes: int = DEFAULT_CACHE_BYTES

    def __post_init__(self) -> None:
        if not os.fspath(self.directory):
            raise ValueError("DiskStorage needs a directory")
        if isinstance(self.cache_bytes, bool) or not isinstance(self.cache_bytes, int):
            raise TypeError(f"cache_bytes must be an int, got {self.cache_bytes!r}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {self.cache_bytes}")


def disk_storage(storage: Union[None, PathLike, DiskStorage]) -> Union[None, DiskStorage]:
    """`storage` as a `DiskStorage` (a path means one there with the default cache), or None
    for memory."""
    if storage is None or isinstance(storage, DiskStorage):
        return storage
    if isinstance(storage, (str, os.PathLike)):
        return DiskStorage(storage)
    raise TypeError(f"storage must be a DiskStorage or a directory, got {storage!r}")
