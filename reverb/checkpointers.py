"""Checkpointers: where a server saves checkpoints and what it restores when it starts.

A checkpoint is a directory `<path>/<UTC timestamp>/` holding one CRC-checked file. It is
written under a temporary name and renamed when complete, so an interrupted save never
replaces the previous checkpoint. On start, a server restores the latest checkpoint under its
checkpointer's path (or `fallback_checkpoint_path` when there is none, or when the latest is
corrupt). Table names must match; the configured settings win over the saved ones.
Checkpoints dm-reverb 0.14 wrote (its TFRecord directories) are restored the same way, from
the path or as the fallback; new checkpoints are written in our format.
"""

from __future__ import annotations

import abc
import os
import tempfile
from typing import Optional

from reverb import pybind


class CheckpointerBase(metaclass=abc.ABCMeta):
    """Base class of checkpointers."""

    @abc.abstractmethod
    def internal_checkpointer(self) -> pybind.Checkpointer:
        """Where the server saves and what it restores (`reverb.pybind.Checkpointer`, as
        `reverb.pybind.create_default_checkpointer` makes one)."""


class DefaultCheckpointer(CheckpointerBase):
    """Checkpoints under `path` (in a `group` subdirectory when `group` is set), keeping the
    latest `keep_latest` (ours; the reference keeps 1)."""

    def __init__(
        self,
        path: str,
        group: str = "",
        fallback_checkpoint_path: Optional[str] = None,
        keep_latest: int = 1,
    ) -> None:
        if not path:
            raise ValueError("path must be a non-empty string")
        if keep_latest < 1:
            raise ValueError(f"keep_latest ({keep_latest}) must be >= 1")
        self.path = os.path.join(path, group) if group else path
        self.fallback_checkpoint_path = fallback_checkpoint_path
        self.keep_latest = keep_latest

    def internal_checkpointer(self) -> pybind.Checkpointer:
        return pybind.Checkpointer(self.path, self.fallback_checkpoint_path, self.keep_latest)

    def __repr__(self) -> str:
        return (
            f"DefaultCheckpointer(path={self.path!r}, "
            f"fallback_checkpoint_path={self.fallback_checkpoint_path!r})"
        )


class TempDirCheckpointer(DefaultCheckpointer):
    """Checkpoints into a fresh temporary directory (the default of `reverb.Server`)."""

    def __init__(self) -> None:
        super().__init__(tempfile.mkdtemp(prefix="reverb-checkpoints-"))


def default_checkpointer(group: Optional[str] = None) -> CheckpointerBase:
    """The checkpointer a server uses when none is given: a temporary directory."""
    del group  # as in the reference
    return TempDirCheckpointer()
