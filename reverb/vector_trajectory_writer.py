"""`VectorTrajectoryWriter`: one writer for the N parallel episodes of a vectorised
environment (beyond the reference).

Each `append` adds one step to every environment's episode: every leaf has a leading
dimension of `num_envs`, and row `i` goes to environment `i`. `create_item` makes one item per
environment from that environment's own history, and `end_episode(envs)` ends only the
episodes of the environments that finished. Native code splits the rows, chunks every
(field, environment) column and streams the items, so a step of all N environments costs
one Python call.

    with client.vector_trajectory_writer(num_envs=8, num_keep_alive_refs=2) as writer:
        for _ in range(steps):
            writer.append({"obs": obs, "action": actions})          # obs: [8, ...]
            ready = writer.episode_steps >= 2
            writer.create_item("replay", 1.0,
                               {"obs": writer.history["obs"][-2:],
                                "action": writer.history["action"][-2:]},
                               envs=ready)
            writer.end_episode(envs=dones)                           # bool mask or indices
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from reverb import _dtypes, _native, _nest
from reverb.trajectory_writer import Path, TrajectoryWriter

Envs = Union[None, int, Sequence[int], Sequence[bool], np.ndarray]


class EnvColumns:
    """The same column of every environment's episode, at the same history positions (an
    int index gives squeezed columns, a slice or list batched ones). Resolved per
    environment when an item is created."""

    __slots__ = ("_writer", "_field", "_steps", "_squeeze", "_path")

    def __init__(
        self, writer: VectorTrajectoryWriter, field: int, steps: Any, squeeze: bool, path: Path
    ) -> None:
        self._writer = writer
        self._field = field
        self._steps = steps
        self._squeeze = squeeze
        self._path = path

    @property
    def is_squeezed(self) -> bool:
        """Whether the leading dimension is dropped."""
        return self._squeeze

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of the cells."""
        return self._writer._spec(self._field)[0]

    @property
    def shape(self) -> Tuple[Optional[int], ...]:
        """The shape of one environment's column (`None` length for slices, whose length
        depends on the episode)."""
        row = self._writer._spec(self._field)[1]
        if self._squeeze:
            return row
        length = len(self._steps) if isinstance(self._steps, list) else None
        return (length, *row)

    def numpy(self, env: Optional[int] = None) -> Union[np.ndarray, List[np.ndarray]]:
        """The selected cells of environment `env`'s episode, stacked (one cell when
        squeezed); without `env`, a list with one such array per environment (episodes
        differ in length). IndexError for positions outside an episode, RuntimeError for
        expired cells."""
        writer = self._writer
        envs = range(writer.num_envs) if env is None else [writer._envs(env)[0]]
        out = []
        for e in envs:
            cells = []
            for step, cell in enumerate(writer._writer.env_cells(self._field, e, self._steps)):
                if cell is None:
                    raise RuntimeError(
                        f"Cannot read position {step} of {self._steps} of column {self._path} "
                        f"in env {e}: it has expired (increase num_keep_alive_refs)"
                    )
                cells.append(_dtypes.from_column(cell))
            if self._squeeze:
                out.append(cells[0])
            else:
                dtype, row = writer._spec(self._field)
                out.append(np.stack(cells) if cells else np.zeros((0, *row), dtype))
        return out if env is None else out[0]

    def __repr__(self) -> str:
        return f"EnvColumns(path={self._path}, steps={self._steps}, squeeze={self._squeeze})"


class _FieldHistory:
    """One field's history in every environment; index like a sequence."""

    __slots__ = ("_writer", "_field", "_path")

    def __init__(self, writer: VectorTrajectoryWriter, field: int, path: Path) -> None:
        self._writer = writer
        self._field = field
        self._path = path

    def __getitem__(self, index: Union[int, slice, Sequence[int]]) -> EnvColumns:
        if isinstance(index, slice):
            steps: Any = (index.start, index.stop, index.step)
            for v in steps:
                if v is not None and not isinstance(v, (int, np.integer)):
                    raise TypeError(f"History slices take ints, got {index}")
            steps = tuple(None if v is None else int(v) for v in steps)
            return EnvColumns(self._writer, self._field, steps, False, self._path)
        if isinstance(index, (int, np.integer)):
            return EnvColumns(self._writer, self._field, int(index), True, self._path)
        return EnvColumns(self._writer, self._field, [int(i) for i in index], False, self._path)

    def __repr__(self) -> str:
        return f"FieldHistory(path={self._path})"


class VectorTrajectoryWriter(TrajectoryWriter):
    """Writes `num_envs` parallel episodes. Build it with
    `Client.vector_trajectory_writer(num_envs, num_keep_alive_refs)`; `flush`, `close`,
    `num_unconfirmed_items` and the context manager work as in `TrajectoryWriter`.
    """

    def __init__(self, internal_writer: _native.TrajectoryWriter, num_envs: int) -> None:
        super().__init__(internal_writer)
        self._num_envs = num_envs
        self._specs: Dict[int, Tuple[np.dtype, Tuple[int, ...]]] = {}

    @property
    def num_envs(self) -> int:
        """Number of parallel episodes."""
        return self._num_envs

    def _spec(self, column: int) -> Tuple[np.dtype, Tuple[int, ...]]:
        # (The native writer's columns are this writer's fields.)
        spec = self._specs.get(column)
        if spec is None:
            native = self._writer.column_spec(column)
            if native is None:
                raise ValueError(f"Column {self._path_name(column)} has no data yet")
            spec = (_dtypes.numpy_dtype(native[0]), tuple(native[1]))
            self._specs[column] = spec
        return spec

    def _envs(self, envs: Envs) -> List[int]:
        if envs is None:
            return list(range(self._num_envs))
        array = np.asarray(envs)
        if array.size == 0 and array.ndim == 1 and array.dtype != np.bool_:
            return []  # e.g. the envs that finished, when none did
        if array.dtype == np.bool_:
            if array.shape != (self._num_envs,):
                raise ValueError(
                    f"A boolean env mask needs shape ({self._num_envs},), got {array.shape}"
                )
            return np.flatnonzero(array).tolist()
        if array.dtype.kind not in "iu" or array.ndim > 1:
            raise ValueError(f"envs must be env indices or a boolean mask, got {envs!r}")
        indices = array.reshape(-1).tolist()
        bad = [i for i in indices if not 0 <= i < self._num_envs]
        if bad:
            raise ValueError(f"env indices {bad} out of range for num_envs {self._num_envs}")
        return indices

    # Writing.

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Appends one step to every environment: each leaf has a leading dimension of
        `num_envs`, row i going to environment i. The structure may grow over time."""
        if partial_step:
            raise ValueError("VectorTrajectoryWriter does not support partial steps")
        self._check_open()
        fields, values = self._flatten(data)
        error = self._writer.append_envs(fields, values)
        if error is not None:
            self._raise_append_error(error, data)

    def append_steps(self, data: Any) -> None:
        raise NotImplementedError("VectorTrajectoryWriter appends one step per call (append)")

    def create_item(
        self,
        table: str,
        priority: Union[float, Sequence[float]],
        trajectory: Any,
        *,
        envs: Envs = None,
    ) -> None:
        """Creates one item in `table` per environment of `envs` (all by default; indices or
        a boolean mask), each from that environment's history. `trajectory` is a nest of
        `history` selections; `priority` is one value or one per selected environment.
        Every item is checked before any is queued."""
        self._check_open()
        leaves = _nest.flatten(trajectory)
        if not leaves:
            raise ValueError("The trajectory must contain at least one column")
        columns = []
        for leaf in leaves:
            if not isinstance(leaf, EnvColumns):
                raise TypeError(
                    f"All leaves of the trajectory must come from history[...], got {type(leaf)}"
                )
            if leaf._writer is not self:
                raise ValueError("Trajectory columns must come from this writer's history")
            columns.append((leaf._field, leaf._steps, leaf._squeeze))
        selected = self._envs(envs)
        if not selected:
            return
        priorities = np.asarray(priority, dtype=np.float64).reshape(-1).tolist()
        self._writer.create_env_items(table, priorities, selected, columns)

    def end_episode(
        self, clear_buffers: bool = True, timeout_ms: Optional[int] = None, *, envs: Envs = None
    ) -> None:
        """Ends the episodes of `envs` (all by default; indices or a boolean mask): their
        chunks are finalized and their items sent, and their next steps start new episodes.
        With `timeout_ms`, also waits (like `flush`) until every item is confirmed."""
        self._check_open()
        selected = self._envs(envs)
        if selected:
            self._writer.end_envs(selected, clear_buffers)
        if timeout_ms is not None:
            self.flush(timeout_ms=timeout_ms)

    # History.

    @property
    def history(self) -> Any:
        """A nest like the appended data; index a leaf (`[-2:]`, `[-1]`, `[[0, 2]]`) to
        select the same positions of every environment's episode for `create_item`."""
        if self._structure is None:
            raise RuntimeError("history is not available before the first append")
        if self._history is None:
            paths = self._paths
            self._history = _nest.map_structure(
                lambda field: _FieldHistory(self, field, paths[field]), self._structure
            )
        return self._history

    @property
    def episode_steps(self) -> np.ndarray:  # type: ignore[override]
        """Steps appended in each environment's current episode (int64, shape [num_envs])."""
        return np.asarray(self._writer.env_steps(), dtype=np.int64)
