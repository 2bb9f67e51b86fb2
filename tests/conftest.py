"""Shared fixtures: real servers on localhost (free port), stopped at teardown."""

from __future__ import annotations

import os
import pathlib
import subprocess
import tempfile
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import reverb
from reverb import rate_limiters, selectors

# scripts/test runs the suite against the installed wheel: it must be the package imported.
# (Resolved: reruns under other interpreters reach it through a symlink.)
_package = str(pathlib.Path(reverb.__file__).resolve())
if os.environ.get("REVERB_EXPECT_INSTALLED") and "site-packages" not in _package:
    raise RuntimeError(f"testing {_package}, not the installed wheel")

# REVERB_TEST_STORAGE=disk runs the suite with every server keeping chunk data on disk (a
# directory of its own, removed at exit) behind a cache of 64 KiB, so that sampling reads
# from disk: the suite passes on both stores.
if os.environ.get("REVERB_TEST_STORAGE") == "disk":
    _storage_root = tempfile.TemporaryDirectory(prefix="reverb-test-storage-")
    _server_init = reverb.Server.__init__

    def _init_on_disk(self, *args, storage=None, **kwargs) -> None:
        if storage is None:
            directory = tempfile.mkdtemp(dir=_storage_root.name)
            storage = reverb.DiskStorage(directory, cache_bytes=64 << 10)
        _server_init(self, *args, storage=storage, **kwargs)

    reverb.Server.__init__ = _init_on_disk

# Every blocking call in the suite passes a timeout so that a bug shows up as a failure,
# never as a hang.
CALL_TIMEOUT = 10.0

STANDARD_TABLE_NAMES = (
    "uniform",
    "prioritized",
    "queue",
    "stack",
    "min_heap",
    "max_heap",
    "max_times_sampled",
)


def standard_tables() -> List[reverb.Table]:
    """One table per selector flavour, plus a queue, a stack and a max_times_sampled table."""
    return [
        reverb.Table(
            name="uniform",
            sampler=selectors.Uniform(),
            remover=selectors.Fifo(),
            max_size=1000,
            rate_limiter=rate_limiters.MinSize(1),
        ),
        reverb.Table(
            name="prioritized",
            sampler=selectors.Prioritized(0.8),
            remover=selectors.Fifo(),
            max_size=1000,
            rate_limiter=rate_limiters.MinSize(1),
        ),
        reverb.Table.queue("queue", 10),
        reverb.Table.stack("stack", 10),
        reverb.Table(
            name="min_heap",
            sampler=selectors.MinHeap(),
            remover=selectors.Fifo(),
            max_size=1000,
            rate_limiter=rate_limiters.MinSize(1),
        ),
        reverb.Table(
            name="max_heap",
            sampler=selectors.MaxHeap(),
            remover=selectors.Fifo(),
            max_size=1000,
            rate_limiter=rate_limiters.MinSize(1),
        ),
        reverb.Table(
            name="max_times_sampled",
            sampler=selectors.Uniform(),
            remover=selectors.Fifo(),
            max_size=1000,
            rate_limiter=rate_limiters.MinSize(1),
            max_times_sampled=2,
        ),
    ]


@pytest.fixture
def rerun_under() -> Callable[..., Tuple[str, subprocess.CompletedProcess]]:
    """Runs test files with another interpreter (a virtualenv named by an environment
    variable), loading the package under test (this checkout's, or the installed wheel's:
    the `reverb` this process imported) and nothing else of ours through PYTHONPATH. Skips
    when the variable is unset or `probe` fails there; asserts the run passed. Returns the
    probe's output and the run."""
    root = pathlib.Path(__file__).resolve().parent.parent
    package = pathlib.Path(reverb.__file__).resolve().parent

    def run(
        env_var: str, probe: str, files: Sequence[str], probe_timeout: float, **env: str
    ) -> Tuple[str, subprocess.CompletedProcess]:
        python = os.environ.get(env_var)
        if not python:
            pytest.skip(f"{env_var} is not set")
        checked = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=probe_timeout
        )
        if checked.returncode != 0:
            pytest.skip(f"{python} cannot run {probe!r}")
        # A directory holding only the package (the installed one sits among other
        # packages that must not shadow the other interpreter's), as the working directory
        # too: the checkout's own `reverb` must not be found first when testing a wheel.
        with tempfile.TemporaryDirectory() as path:
            (pathlib.Path(path) / "reverb").symlink_to(package, target_is_directory=True)
            result = subprocess.run(
                [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={root}"]
                + [str(root / f) for f in files],
                cwd=path,
                capture_output=True,
                text=True,
                timeout=300,
                env={**os.environ, "PYTHONPATH": path, **env},
            )
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
        assert " passed" in result.stdout
        return checked.stdout, result

    return run


@pytest.fixture(params=["inproc", "grpc"])
def both_paths(request, monkeypatch) -> str:
    """Runs a test twice: reaching servers of this process directly (sampling and inserting
    without gRPC), and over loopback gRPC (`REVERB_NO_INPROC=1`); once for tests marked
    `one_path` (see `pytest_collection_modifyitems`)."""
    if request.param == "grpc":
        monkeypatch.setenv("REVERB_NO_INPROC", "1")
    return request.param


def pytest_collection_modifyitems(config, items) -> None:
    """Leaves out the gRPC run of tests marked `one_path` (tests of what does not depend on
    the path, e.g. TensorFlow's own modes in a fresh process, which take seconds)."""
    once = [
        item
        for item in items
        if item.get_closest_marker("one_path")
        and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("both_paths") == "grpc"
    ]
    if once:
        config.hook.pytest_deselected(items=once)
        left_out = set(map(id, once))
        items[:] = [item for item in items if id(item) not in left_out]


@pytest.fixture
def make_server() -> Callable[..., reverb.Server]:
    """Factory of servers; every server it made is stopped at teardown. With `metrics_port=0`
    a server serves its metrics (see `_metrics`) on a free port."""
    servers: List[reverb.Server] = []

    def make(
        tables: Sequence[reverb.Table],
        port: Optional[int] = None,
        metrics_port: Optional[int] = None,
    ) -> reverb.Server:
        server = reverb.Server(tables=list(tables), port=port, metrics_port=metrics_port)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def server(make_server) -> reverb.Server:
    """A server with the standard tables."""
    return make_server(standard_tables())


@pytest.fixture
def client(server) -> reverb.Client:
    return server.localhost_client()


@pytest.fixture
def tables(server) -> Dict[str, reverb.Table]:
    """The standard server's tables, by name (in-process, for `info`/`can_*`)."""
    return server.in_process_tables


@pytest.fixture
def sample_one() -> Callable[..., reverb.ReplaySample]:
    """Samples one item (emit_timesteps=False) with a timeout."""

    def sample(client: reverb.Client, table: str, timeout: float = CALL_TIMEOUT):
        samples = list(client.sample(table, 1, emit_timesteps=False, timeout=timeout))
        assert len(samples) == 1
        return samples[0]

    return sample


@pytest.fixture
def sample_values() -> Callable[..., List[int]]:
    """Samples `n` items whose data is one integer scalar; returns the integers in order."""

    def sample(client: reverb.Client, table: str, n: int, timeout: float = CALL_TIMEOUT):
        out = []
        for steps in client.sample(table, n, timeout=timeout):
            assert len(steps) == 1
            (leaf,) = steps[0].data
            out.append(int(leaf))
        assert len(out) == n
        return out

    return sample


def insert_values(
    client: reverb.Client,
    table: str,
    values: Sequence[int],
    priorities: Optional[Sequence[float]] = None,
) -> None:
    """Inserts each integer as a one-leaf item (int64 scalar)."""
    if priorities is None:
        priorities = [1.0] * len(values)
    for value, priority in zip(values, priorities):
        client.insert(np.int64(value), {table: priority}, timeout=CALL_TIMEOUT)


@pytest.fixture
def insert() -> Callable[..., None]:
    return insert_values
