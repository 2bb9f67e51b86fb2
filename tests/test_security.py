"""Token authentication and the bind address: a server with a token serves only calls that
carry it (from every client kind, given as `auth_token=` or `REVERB_AUTH_TOKEN`); any other
call gets UnauthenticatedError and reads or changes nothing."""

from __future__ import annotations

import pathlib
import re
import socket
import urllib.request

import numpy as np
import pytest
from _standalone import start, stop

import reverb

T = 10.0
TOKEN = "s3cret-token"


def _table() -> reverb.Table:
    return reverb.Table(
        "t",
        sampler=reverb.selectors.Fifo(),
        remover=reverb.selectors.Fifo(),
        max_size=100,
        rate_limiter=reverb.rate_limiters.MinSize(1),
    )


@pytest.fixture(params=["inproc", "grpc"])
def secured(request, monkeypatch):
    if request.param == "grpc":
        monkeypatch.setenv("REVERB_NO_INPROC", "1")
    server = reverb.Server([_table()], auth_token=TOKEN)
    try:
        yield server, f"localhost:{server.port}"
    finally:
        server.stop()


@pytest.mark.parametrize("token", [None, "wrong"])
def test_calls_without_the_token_are_refused_and_change_nothing(secured, token) -> None:
    server, address = secured
    good = reverb.Client(address, auth_token=TOKEN)
    good.insert(np.arange(3), {"t": 1.0}, timeout=T)
    bad = reverb.Client(address, auth_token=token)
    calls = [
        lambda: bad.server_info(timeout=T),
        lambda: bad.insert(np.arange(3), {"t": 1.0}, timeout=T),
        lambda: next(bad.sample("t", timeout=T)),
        lambda: bad.mutate_priorities("t", deletes=[1], timeout=T),
        lambda: bad.reset("t", timeout=T),
        lambda: bad.checkpoint(timeout=T),
    ]
    for call in calls:
        with pytest.raises(reverb.errors.UnauthenticatedError) as e:
            call()
        assert TOKEN not in str(e.value)
    writer = bad.trajectory_writer(1)
    with pytest.raises((reverb.errors.UnauthenticatedError, ValueError)):
        writer.append({"x": np.int32(1)})
        writer.create_item("t", 1.0, writer.history["x"][-1:])
        writer.flush(timeout_ms=int(T * 1000))
    with pytest.raises(reverb.errors.UnauthenticatedError):
        next(iter(reverb.TrajectoryIterator(address, "t", auth_token=token)))
    assert server.in_process_tables["t"].info.current_size == 1
    (sample,) = next(good.sample("t", timeout=T))
    assert sample.data[0].tolist() == [0, 1, 2]


def test_every_client_kind_with_the_token_is_served(secured) -> None:
    server, address = secured
    client = reverb.Client(address, auth_token=TOKEN)
    with client.trajectory_writer(1) as writer:
        for i in range(3):
            writer.append({"x": np.int32(i)})
            writer.create_item("t", 1.0, writer.history["x"][-1:])
    assert client.server_info(timeout=T)["t"].current_size == 3
    it = reverb.TrajectoryIterator(address, "t", auth_token=TOKEN, max_samples=2)
    assert [s.data[0].item() for s in it] == [0, 0]
    assert server.localhost_client().server_info(timeout=T)["t"].current_size == 3


def test_tensorflow_clients_and_datasets_send_the_token(secured) -> None:
    tf = pytest.importorskip("tensorflow")
    server, address = secured
    reverb.Client(address, auth_token=TOKEN).insert(np.int64(7), {"t": 1.0}, timeout=T)
    ds = reverb.TrajectoryDataset(
        address, "t", tf.int64, tf.TensorShape([1]), 1, max_samples=1, auth_token=TOKEN
    )
    assert [s.data.numpy().tolist() for s in ds] == [[7]]
    tf_client = reverb.TFClient(address, auth_token=TOKEN)
    assert int(tf_client.sample("t", [tf.int64]).data[0]) == 7
    with pytest.raises(tf.errors.UnauthenticatedError):
        reverb.TFClient(address, auth_token="wrong").sample("t", [tf.int64])
    with pytest.raises(tf.errors.UnauthenticatedError):
        list(
            reverb.TrajectoryDataset(address, "t", tf.int64, tf.TensorShape([1]), 1, max_samples=1)
        )


def test_the_environment_variable_is_the_default_token(monkeypatch) -> None:
    monkeypatch.setenv("REVERB_AUTH_TOKEN", TOKEN)
    server = reverb.Server([_table()])
    try:
        address = f"localhost:{server.port}"
        # Unmodified code (no token anywhere) works with auth on.
        client = reverb.Client(address)
        client.insert(np.int32(1), {"t": 1.0}, timeout=T)
        assert client.server_info(timeout=T)["t"].current_size == 1
        with pytest.raises(reverb.errors.UnauthenticatedError):
            reverb.Client(address, auth_token="wrong").server_info(timeout=T)
    finally:
        server.stop()


def test_a_server_listens_only_on_its_host() -> None:
    server = reverb.Server([_table()], host="127.0.0.1")
    try:
        client = reverb.Client(f"127.0.0.1:{server.port}")
        assert "t" in client.server_info(timeout=T)
        with pytest.raises(OSError):
            socket.create_connection(("::1", server.port), timeout=2).close()
        assert "t" in server.localhost_client().server_info(timeout=T)
    finally:
        server.stop()
    with pytest.raises(OSError, match="no-such-host.invalid"):
        reverb.Server([_table()], host="no-such-host.invalid")


def test_standalone_server_takes_host_token_file_and_metrics_port(tmp_path: pathlib.Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    config = {
        "port": 0,
        "host": "127.0.0.1",
        "auth_token_file": str(token_file),
        "metrics_port": 0,
        "tables": [{"name": "q", "queue": 10}],
    }
    proc, port, lines = start(config, tmp_path)
    try:
        line = proc.stderr.readline()
        lines.append(line)
        metrics_port = int(re.search(r"metrics on port (\d+)", line).group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=T) as r:
            assert 'reverb_table_size{table="q"} 0' in r.read().decode()
        address = f"127.0.0.1:{port}"
        with pytest.raises(reverb.errors.UnauthenticatedError):
            reverb.Client(address).server_info(timeout=T)
        assert "q" in reverb.Client(address, auth_token=TOKEN).server_info(timeout=T)
    finally:
        log = stop(proc, lines)
    assert "127.0.0.1" in log and "auth token" in log and TOKEN not in log
