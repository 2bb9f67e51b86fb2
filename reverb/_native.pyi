"""Type stubs of `reverb._native`, the Rust extension (kept by hand; the test suite checks
them against the built module with mypy's stubtest)."""

from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union, final

import numpy as np

from reverb.replay_sample import SampleInfo

__all__ = [
    "AppendError",
    "BatchWriter",
    "CellRef",
    "CheckpointItems",
    "CheckpointReader",
    "Client",
    "ColumnHistory",
    "MAX_SHARDS",
    "PatternSchedule",
    "RateLimiter",
    "Sampler",
    "Selector",
    "Server",
    "StepColumns",
    "StepLayout",
    "StructuredWriter",
    "Table",
    "TableInfo",
    "TableSignature",
    "TrajectoryColumn",
    "TrajectoryWriter",
    "__version__",
    "_malloc_tuned",
    "_shm_chunks_received",
    "connect_wait_seconds",
    "descriptor_set",
    "inproc_port",
    "key_shard",
    "sample_shards",
    "server_info_all",
    "table_signature",
    "tf_dtype_name",
]
__version__: str
MAX_SHARDS: int

# A tensor as it crosses the boundary: TensorFlow DataType value, shape, and its bytes.
_Column = Tuple[int, List[int], np.ndarray]

@final
class Selector:
    """An item selector (what `reverb.item_selectors` hands a table)."""

    @staticmethod
    def uniform() -> Selector: ...
    @staticmethod
    def prioritized(*, priority_exponent: float) -> Selector: ...
    @staticmethod
    def fifo() -> Selector: ...
    @staticmethod
    def lifo() -> Selector: ...
    @staticmethod
    def min_heap() -> Selector: ...
    @staticmethod
    def max_heap() -> Selector: ...

@final
class RateLimiter:
    """A rate limiter's bounds (what `reverb.rate_limiters` hands a table)."""

    def __new__(
        cls,
        *,
        samples_per_insert: float,
        min_size_to_sample: int,
        min_diff: float,
        max_diff: float,
    ) -> RateLimiter: ...

@final
class Table:
    """A replay table of the engine, usable before and while a server serves it."""

    def __new__(
        cls,
        *,
        name: str,
        sampler: Selector,
        remover: Selector,
        max_size: int,
        max_times_sampled: int,
        rate_limiter: RateLimiter,
        signature: Optional[bytes] = None,
    ) -> Table: ...
    @property
    def name(self) -> str: ...
    def info(self) -> bytes: ...
    def can_sample(self, n: int) -> bool: ...
    def can_insert(self, n: int) -> bool: ...
    def size(self) -> int: ...

@final
class Server:
    """A gRPC server (and in-process service) serving tables on a port."""

    def __new__(
        cls,
        tables: Sequence[Table],
        *,
        port: int = 0,
        checkpoint_root: Optional[str] = None,
        fallback_checkpoint_path: Optional[str] = None,
        keep_latest: int = 1,
        host: Optional[str] = None,
        auth_token: Optional[str] = None,
        metrics_port: Optional[int] = None,
        log_stats_every: Optional[float] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        tls_client_ca: Optional[str] = None,
        storage_dir: Optional[str] = None,
        cache_bytes: int = 1073741824,
        sync_interval: float = 1.0,
        sync_always: bool = False,
    ) -> Server: ...
    @property
    def port(self) -> int: ...
    @property
    def metrics_port(self) -> Optional[int]: ...
    def stop(self) -> None: ...
    def wait(self, timeout: Optional[float] = None) -> bool: ...

@final
class Client:
    """A client of one server address."""

    def __new__(
        cls,
        address: str,
        auth_token: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        key_shard: Optional[int] = None,
    ) -> Client: ...
    @property
    def address(self) -> str: ...
    def server_info(self, timeout: Optional[float] = None) -> List[TableInfo]: ...
    def mutate_priorities(
        self,
        table: str,
        keys: bytes,
        priorities: bytes,
        deletes: Sequence[int],
        timeout: Optional[float] = None,
    ) -> None: ...
    def reset(self, table: str, timeout: Optional[float] = None) -> None: ...
    def checkpoint(self, timeout: Optional[float] = None) -> str: ...
    def insert(
        self,
        values: Sequence[object],
        priorities: Sequence[Tuple[str, float]],
        timeout_ms: Optional[int] = None,
    ) -> None: ...
    def insert_steps(
        self,
        values: Sequence[object],
        priorities: Sequence[Tuple[str, bytes]],
        timeout_ms: Optional[int] = None,
    ) -> None: ...
    def sample(
        self,
        table: str,
        num_samples: int,
        rate_limiter_timeout: Optional[float] = None,
        timeout: Optional[float] = None,
    ) -> Tuple[List[Tuple[SampleInfo, List[_Column]]], Optional[BaseException]]: ...

@final
class TableInfo:
    """A table's `TableInfo`, as the native client decoded it."""

    @property
    def name(self) -> str: ...
    @property
    def max_times_sampled(self) -> int: ...
    @property
    def signature_bytes(self) -> bytes: ...
    @property
    def signature(self) -> Optional[TableSignature]: ...
    def serialized(self) -> bytes: ...

@final
class TableSignature:
    """A table's signature, flattened in `tf.nest` order."""

    @property
    def specs(self) -> List[Tuple[str, int, Optional[List[int]]]]: ...
    def __len__(self) -> int: ...
    def problem(
        self, table: str, leaves: Sequence[Tuple[int, Sequence[int], Sequence[int]]]
    ) -> Optional[str]: ...

@final
class PatternSchedule:
    """Checked `PatternDataset` configs: rows kept per leaf, where trajectories lie in them."""

    def __new__(
        cls, configs: List[bytes], num_leaves: int, respect_episode_boundaries: bool
    ) -> PatternSchedule: ...
    @property
    def history(self) -> Dict[int, int]: ...
    @property
    def data_leaves(self) -> List[int]: ...
    @property
    def state_len(self) -> int: ...
    def slices(self, c: int) -> List[Tuple[int, int, int, int, bool]]: ...
    def __len__(self) -> int: ...

@final
class AppendError:
    """Why an append was refused, naming the writer column."""

    @property
    def column(self) -> int: ...
    @property
    def already_set(self) -> bool: ...
    @property
    def expected(self) -> Optional[Tuple[int, List[int]]]: ...
    @property
    def got(self) -> Optional[Tuple[int, List[int]]]: ...

@final
class CellRef:
    """One cell of a writer's history (what iterating a history column gives)."""

    @property
    def expired(self) -> bool: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype: ...
    def numpy(self) -> np.ndarray: ...

@final
class TrajectoryColumn:
    """A column of an item: references to cells of one writer's history."""

    def __new__(
        cls, data_references: object, *, squeeze: bool = False, path: Optional[object] = None
    ) -> TrajectoryColumn: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[CellRef]: ...
    def __getitem__(self, key: Union[int, slice, Sequence[int]], /) -> TrajectoryColumn: ...
    @property
    def _writer(self) -> Optional[object]: ...
    @property
    def _cells(self) -> List[Tuple[int, int]]: ...
    @property
    def is_squeezed(self) -> bool: ...
    @property
    def shape(self) -> Tuple[Optional[int], ...]: ...
    @property
    def dtype(self) -> np.dtype: ...
    def numpy(self) -> np.ndarray: ...
    def __copy__(self) -> TrajectoryColumn: ...
    def __deepcopy__(self, memo: object, /) -> TrajectoryColumn: ...

@final
class ColumnHistory:
    """The cells of one column over the writer's current episode."""

    def __new__(
        cls, owner: object, native: TrajectoryWriter, column: int, path: object
    ) -> ColumnHistory: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[CellRef]: ...
    def __getitem__(self, key: Union[int, slice, Sequence[int]], /) -> TrajectoryColumn: ...
    @property
    def _column(self) -> int: ...
    def numpy(self) -> np.ndarray: ...

@final
class StepLayout:
    """The nest structure of a step, to flatten later steps of that structure natively."""

    @staticmethod
    def of(step: object, columns: Sequence[int]) -> Optional[StepLayout]: ...
    def flatten(self, step: object) -> Optional[List[object]]: ...

@final
class StepColumns:
    """The writer column of each leaf path of a trajectory writer's steps; flattens steps."""

    def __new__(cls) -> StepColumns: ...
    def flatten(
        self, step: object, width: Optional[int] = None
    ) -> Tuple[List[int], List[object], Optional[List[int]]]: ...
    def column(self, path: Tuple[object, ...]) -> int: ...
    @property
    def width(self) -> int: ...
    @property
    def paths(self) -> List[Tuple[object, ...]]: ...

# Which episode steps an item column of a vectorised writer takes.
_Steps = Union[int, Tuple[Optional[int], Optional[int], Optional[int]], List[int]]

@final
class TrajectoryWriter:
    """The native half of `TrajectoryWriter`, `VectorTrajectoryWriter` and `Client.insert`."""

    def __new__(
        cls,
        client: Client,
        *,
        num_keep_alive_refs: int,
        max_chunk_length: Optional[int] = None,
        max_in_flight_items: int = 1024,
        delta_encode: bool = False,
        reconnect_timeout: float = 60.0,
        num_envs: Optional[int] = None,
        validate_items: bool = False,
        signature_timeout_ms: Optional[int] = None,
    ) -> TrajectoryWriter: ...
    def append(
        self, columns: Sequence[int], values: Sequence[object], partial: bool = False
    ) -> Optional[AppendError]: ...
    def append_step(
        self, step: object, columns: StepColumns, partial: bool, width: Optional[int] = None
    ) -> Tuple[Optional[AppendError], Optional[List[int]]]: ...
    def append_steps(
        self, columns: Sequence[int], values: Sequence[object]
    ) -> Optional[AppendError]: ...
    def create_item(
        self,
        table: str,
        priority: float,
        columns: Sequence[Tuple[Sequence[Tuple[int, int]], bool]],
    ) -> int: ...
    def create_item_of_columns(
        self, table: str, priority: float, trajectory: object, owner: object
    ) -> Optional[int]: ...
    def create_item_of_last(
        self, table: str, priority: float, columns: Sequence[int], num_steps: int
    ) -> int: ...
    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None: ...
    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None) -> None: ...
    @property
    def failed(self) -> bool: ...
    def abort(self) -> None: ...
    def close(self) -> None: ...
    def configure(
        self, column: int, num_keep_alive_refs: int, max_chunk_length: Optional[int]
    ) -> None: ...
    @property
    def episode_steps(self) -> int: ...
    @property
    def episode_start(self) -> int: ...
    @property
    def step_is_open(self) -> bool: ...
    def column_spec(self, column: int) -> Optional[Tuple[int, List[int]]]: ...
    def alive(self, column: int, steps: Sequence[int]) -> List[bool]: ...
    def read_cell(self, column: int, step: int) -> Optional[_Column]: ...
    def unconfirmed(self) -> int: ...
    def append_envs(
        self, fields: Sequence[int], values: Sequence[object]
    ) -> Optional[AppendError]: ...
    def env_steps(self) -> List[int]: ...
    def env_starts(self) -> List[int]: ...
    def end_envs(self, envs: Sequence[int], clear_buffers: bool) -> None: ...
    def env_cells(self, field: int, env: int, steps: _Steps) -> List[Optional[_Column]]: ...
    def create_env_items(
        self,
        table: str,
        priorities: Sequence[float],
        envs: Sequence[int],
        columns: Sequence[Tuple[int, _Steps, bool]],
    ) -> None: ...

@final
class BatchWriter:
    """The native half of `BatchWriter`: batches of steps as item runs on a stream of its own,
    several in flight."""

    def __new__(cls, client: Client, max_in_flight_items: int) -> BatchWriter: ...
    def insert_steps(
        self,
        values: Sequence[object],
        priorities: Sequence[Tuple[str, bytes]],
        timeout_ms: Optional[int] = None,
    ) -> bool: ...
    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None: ...
    def num_unconfirmed(self) -> int: ...
    def close(self) -> None: ...

@final
class StructuredWriter:
    """The native half of `StructuredWriter`: evaluates its configs after every append."""

    def __new__(
        cls,
        client: Client,
        configs: Sequence[bytes],
        *,
        max_in_flight_items: int = 1024,
        reconnect_timeout: float = 60.0,
    ) -> StructuredWriter: ...
    def append(self, values: Sequence[object], partial: bool = False) -> Optional[AppendError]: ...
    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None: ...
    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None) -> None: ...
    @property
    def step_is_open(self) -> bool: ...
    def unconfirmed(self) -> int: ...
    def close(self) -> None: ...

@final
class Sampler:
    """The prefetching sampler behind `TrajectoryIterator` and `TorchDataset`: elements of
    `n` samples, stacked or not, the next assembled while the last is used."""

    def __new__(
        cls,
        clients: List[Client],
        table: str,
        *,
        n: int,
        stacked: bool,
        max_in_flight_samples_per_worker: int,
        num_workers: int,
        max_samples: int,
        rate_limiter_timeout_ms: int,
    ) -> Sampler: ...
    def next(
        self,
    ) -> Union[
        None,
        Tuple[SampleInfo, List[_Column]],
        List[Tuple[SampleInfo, List[_Column]]],
    ]: ...
    def missing_shards(self) -> List[str]: ...
    def close(self) -> None: ...

@final
class CheckpointReader:
    """A checkpoint file read without a server (`reverb.checkpoint.open`)."""

    def __new__(cls, path: str) -> CheckpointReader: ...
    def tables(self) -> List[Tuple[bytes, int]]: ...
    def items(self, table: str, data: bool = True) -> CheckpointItems: ...

@final
class CheckpointItems:
    """One table's items in insertion order: (key, priority, times_sampled, (seconds,
    nanos), (episode id, step), squeezed columns, per column (episode id, first step, rows),
    columns or None)."""

    def __iter__(self) -> CheckpointItems: ...
    def __next__(
        self,
    ) -> Tuple[
        int,
        float,
        int,
        Tuple[int, int],
        Tuple[int, int],
        List[bool],
        List[Tuple[int, int, int]],
        Optional[List[_Column]],
    ]: ...

def connect_wait_seconds() -> float: ...
def server_info_all(
    clients: List[Client], timeouts: List[Optional[float]]
) -> List[Union[List[TableInfo], BaseException]]: ...
def sample_shards(
    clients: List[Client],
    missing: List[int],
    table: str,
    num_samples: int,
    timeout: Optional[float] = None,
) -> Tuple[
    List[Tuple[SampleInfo, List[_Column]]], List[int], Optional[BaseException], List[int]
]: ...
def key_shard(key: int) -> Optional[int]: ...
def descriptor_set() -> bytes: ...
def table_signature(signature: bytes) -> Optional[TableSignature]: ...
def tf_dtype_name(dtype: int) -> str: ...
def inproc_port(address: str, auth_token: Optional[str] = None) -> Optional[int]: ...
def _shm_chunks_received() -> int: ...
def _malloc_tuned() -> bool: ...
