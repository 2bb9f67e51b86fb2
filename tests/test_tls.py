"""TLS: a server given a certificate serves only TLS; clients that trust its authority (given
as `tls_ca=` or `REVERB_TLS_CA`) are served from every client kind, and plain or untrusting
clients are refused at once with an error that says what to set, storing nothing. With a
client CA only clients presenting a certificate it signed are served (mutual TLS)."""

from __future__ import annotations

import pathlib
import pickle
import time

import numpy as np
import pytest
from _standalone import start, stop

import reverb

T = 10.0
TLS = pathlib.Path(__file__).parent / "data" / "tls"


def _table() -> reverb.Table:
    return reverb.Table(
        "t",
        sampler=reverb.selectors.Fifo(),
        remover=reverb.selectors.Fifo(),
        max_size=100,
        rate_limiter=reverb.rate_limiters.MinSize(1),
    )


@pytest.fixture
def tls_server(monkeypatch):
    # Over the wire: a client of this process would otherwise call the server directly.
    monkeypatch.setenv("REVERB_NO_INPROC", "1")
    server = reverb.Server([_table()], tls_cert=TLS / "server.pem", tls_key=TLS / "server.key")
    try:
        yield server, f"localhost:{server.port}"
    finally:
        server.stop()


def _refused_quickly(call, match: str) -> None:
    start = time.monotonic()
    with pytest.raises(reverb.errors.UnavailableError, match=match):
        call()
    assert time.monotonic() - start < 8


def test_clients_that_trust_the_authority_are_served_over_tls(tls_server) -> None:
    server, address = tls_server
    client = reverb.Client(address, tls_ca=TLS / "ca.pem")
    client.insert(np.arange(3), {"t": 1.0}, timeout=T)
    with client.trajectory_writer(1) as writer:
        writer.append({"x": np.arange(3)})
        writer.create_item("t", 1.0, writer.history["x"][-1:])
    assert client.server_info(timeout=T)["t"].current_size == 2
    # A pickled client (e.g. sent to an actor process) keeps its TLS settings.
    copy = pickle.loads(pickle.dumps(client))
    (sample,) = next(copy.sample("t", timeout=T))
    assert sample.data[0].tolist() == [0, 1, 2]
    it = reverb.TrajectoryIterator(address, "t", max_samples=1, tls_ca=str(TLS / "ca.pem"))
    assert [s.data[0].ravel().tolist() for s in it] == [[0, 1, 2]]


def test_plain_and_untrusting_clients_are_refused_and_store_nothing(tls_server) -> None:
    server, address = tls_server
    plain = reverb.Client(address)
    _refused_quickly(lambda: plain.insert(np.arange(3), {"t": 1.0}, timeout=T), "tls_ca")
    stranger = reverb.Client(address, tls_ca=TLS / "other-ca.pem")
    _refused_quickly(lambda: stranger.server_info(timeout=T), "certificate")
    assert server.in_process_tables["t"].info.current_size == 0


def test_with_a_client_ca_only_clients_with_a_certificate_are_served(monkeypatch) -> None:
    monkeypatch.setenv("REVERB_NO_INPROC", "1")
    server = reverb.Server(
        [_table()],
        tls_cert=TLS / "server.pem",
        tls_key=TLS / "server.key",
        tls_client_ca=TLS / "ca.pem",
    )
    try:
        address = f"localhost:{server.port}"
        anonymous = reverb.Client(address, tls_ca=TLS / "ca.pem")
        _refused_quickly(lambda: anonymous.insert(np.int32(1), {"t": 1.0}, timeout=T), "tls_cert")
        known = reverb.Client(
            address, tls_ca=TLS / "ca.pem", tls_cert=TLS / "client.pem", tls_key=TLS / "client.key"
        )
        known.insert(np.int32(2), {"t": 1.0}, timeout=T)
        assert server.in_process_tables["t"].info.current_size == 1
    finally:
        server.stop()


def test_tensorflow_clients_and_datasets_connect_over_tls(tls_server) -> None:
    tf = pytest.importorskip("tensorflow")
    _, address = tls_server
    ca = str(TLS / "ca.pem")
    tf_client = reverb.TFClient(address, tls_ca=ca)
    tf_client.insert([tf.constant(7, tf.int64)], tf.constant(["t"]), tf.constant([1.0], tf.float64))
    ds = reverb.TrajectoryDataset(
        address, "t", tf.int64, tf.TensorShape([1]), 1, max_samples=1, tls_ca=ca
    )
    assert [s.data.numpy().tolist() for s in ds] == [[7]]
    assert int(tf_client.sample("t", [tf.int64]).data[0]) == 7
    with pytest.raises(tf.errors.UnavailableError, match="tls_ca"):
        reverb.TFClient(address).sample("t", [tf.int64])


def test_wrong_tls_files_are_value_errors_naming_the_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="missing.pem"):
        reverb.Server([_table()], tls_cert=tmp_path / "missing.pem", tls_key=TLS / "server.key")
    with pytest.raises(ValueError, match="private key"):
        reverb.Server([_table()], tls_cert=TLS / "server.pem")
    with pytest.raises(ValueError, match="no certificate"):
        reverb.Client("localhost:1", tls_ca=TLS / "server.key")
    with pytest.raises(ValueError, match="tls_ca"):
        reverb.Client("localhost:1", tls_cert=TLS / "client.pem", tls_key=TLS / "client.key")


def test_standalone_server_takes_tls_from_its_config_or_the_environment(
    tmp_path: pathlib.Path, monkeypatch
) -> None:
    cert, key = str(TLS / "server.pem"), str(TLS / "server.key")
    configs = [
        ({"tls_cert": cert, "tls_key": key}, {}),
        ({}, {"REVERB_TLS_CERT": cert, "REVERB_TLS_KEY": key}),
    ]
    for extra, env in configs:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        config = {"port": 0, "tables": [{"name": "q", "queue": 10}], **extra}
        proc, port, lines = start(config, tmp_path)
        for name in env:
            monkeypatch.delenv(name)
        try:
            plain = reverb.Client(f"localhost:{port}")
            _refused_quickly(lambda c=plain: c.server_info(timeout=T), "tls_ca")
            # Unmodified client code with REVERB_TLS_CA set connects over TLS.
            monkeypatch.setenv("REVERB_TLS_CA", str(TLS / "ca.pem"))
            assert "q" in reverb.Client(f"localhost:{port}").server_info(timeout=T)
            monkeypatch.delenv("REVERB_TLS_CA")
        finally:
            log = stop(proc, lines)
        assert "TLS" in log
