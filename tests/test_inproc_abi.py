"""The in-process sampling C ABI (`reverb_inproc_sample_v3`) that the TensorFlow kernels call,
called here through ctypes: a waiting call returns as soon as its caller cancels it, and a
cancelled call takes no item inserted afterwards."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Callable

import numpy as np
from _metrics import waiting
from _wait import wait_for

import reverb
from reverb import _native

EMIT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
INFO, SHARED_DATA = 1, 5


class SharedData(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("len", ctypes.c_size_t),
        ("owner", ctypes.c_void_p),
        ("release", ctypes.CFUNCTYPE(None, ctypes.c_void_p)),
    ]


def _sample_fn():
    fn = ctypes.CDLL(_native.__file__).reverb_inproc_sample_v3
    fn.restype = ctypes.c_int32
    fn.argtypes = [
        ctypes.c_uint16,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_uint64,
        ctypes.POINTER(ctypes.c_bool),
        ctypes.c_void_p,
        EMIT,
    ]
    return fn


def _call(port: int, table: str, wait_ms: int, cancel: ctypes.c_bool) -> tuple[int, int, float]:
    """Calls the ABI; returns (status, samples received, seconds taken)."""
    got = []

    def emit(_sink, kind, ptr, length):
        if kind == INFO:
            got.append(1)
        elif kind == SHARED_DATA:  # the lent bytes go back at once
            lent = SharedData.from_address(ptr)
            lent.release(lent.owner)

    callback = EMIT(emit)
    name = table.encode()
    start = time.monotonic()
    status = _sample_fn()(port, name, len(name), 8, wait_ms, ctypes.byref(cancel), None, callback)
    return status, len(got), time.monotonic() - start


def _queue_server() -> reverb.Server:
    return reverb.Server([reverb.Table.queue("q", 10)], metrics_port=0)


def _waiting_call(server: reverb.Server, cancel: ctypes.c_bool) -> Callable[[], tuple]:
    """Starts a call of up to 5 s on an empty queue in a thread and returns once it waits;
    the function returned joins it and gives its (status, samples, seconds)."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(_call(server.port, "q", 5000, cancel)))
    thread.start()
    wait_for(lambda: waiting(server.metrics_port, "q", "sample") == 1, 10, "the call to wait")

    def join() -> tuple:
        thread.join(10)
        return result[0]

    return join


def test_a_waiting_call_takes_an_item_inserted_while_it_waits() -> None:
    server = _queue_server()
    try:
        client = server.localhost_client()
        join = _waiting_call(server, ctypes.c_bool(False))
        client.insert([np.int64(1)], {"q": 1.0})
        status, n, seconds = join()
        assert (status, n) == (0, 1) and seconds < 4
        assert client.server_info()["q"].current_size == 0
    finally:
        server.stop()


def test_a_cancelled_call_returns_soon_and_takes_nothing_after() -> None:
    server = _queue_server()
    try:
        client = server.localhost_client()
        cancel = ctypes.c_bool(False)
        join = _waiting_call(server, cancel)
        cancel.value = True
        client.insert([np.int64(1)], {"q": 1.0})
        status, n, seconds = join()
        assert (status, n) == (0, 0)
        assert seconds < 1.0, f"the cancelled call went on for {seconds:.2f} s"
        # The item is still there for the next caller.
        assert client.server_info()["q"].current_size == 1
        [[sample]] = client.sample("q", num_samples=1, timeout=5)
        assert int(sample.data[0]) == 1
        # A call cancelled before it starts takes nothing either.
        client.insert([np.int64(2)], {"q": 1.0})
        assert _call(server.port, "q", 1000, ctypes.c_bool(True))[:2] == (0, 0)
        assert client.server_info()["q"].current_size == 1
    finally:
        server.stop()
