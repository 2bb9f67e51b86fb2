"""Waiting on facts, not times: a test that needs something to have happened (an item
stored, a call blocked on its rate limiter, a server stopped) polls for what the system
reports about it, rather than sleeping and hoping."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence


def wait_for(
    predicate: Callable[[], bool],
    timeout: float = 10.0,
    what: str = "",
    *,
    failures: Sequence[BaseException] = (),
    interval: float = 0.01,
) -> None:
    """Returns once `predicate()` is true (polling every `interval` seconds); raises an
    AssertionError naming `what` if it is still false after `timeout` seconds, or at once
    when `failures` (the errors a test's background threads record) is not empty."""
    deadline = time.monotonic() + timeout
    while True:
        assert not failures, failures
        if predicate():
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def answers(client: Any) -> bool:
    """Whether the server `client` reaches answers a call now (within a second)."""
    try:
        client.server_info(timeout=1.0)
        return True
    except Exception:  # noqa: BLE001 - not yet
        return False
