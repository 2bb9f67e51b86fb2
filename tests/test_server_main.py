"""The standalone server: started from a config file, used by a client, stopped by SIGTERM,
restoring its checkpoints across restarts."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import numpy as np
import pytest
from _standalone import start, stop

import reverb
from reverb import server_main

T = 10.0


CONFIG = {
    "port": 0,
    "tables": [
        {
            "name": "replay",
            "sampler": {"prioritized": 0.6},
            "remover": "fifo",
            "max_size": 1000,
            "rate_limiter": {"sample_to_insert_ratio": [2.0, 1, 100.0]},
        },
        {"name": "queue", "queue": 10},
        {"name": "heap", "sampler": "max_heap", "max_size": 5, "max_times_sampled": 2},
    ],
}


def test_serves_tables_from_a_config_file_and_stops_on_sigterm(tmp_path: pathlib.Path) -> None:
    proc, port, lines = start(CONFIG, tmp_path)
    try:
        client = reverb.Client(f"localhost:{port}")
        infos = client.server_info(timeout=T)
        assert sorted(infos) == ["heap", "queue", "replay"]
        assert infos["replay"].sampler_options.prioritized.priority_exponent == 0.6
        assert infos["replay"].rate_limiter_info.samples_per_insert == 2.0
        assert infos["queue"].max_times_sampled == 1
        assert infos["heap"].max_size == 5
        client.insert(np.arange(3), {"queue": 1.0, "replay": 2.0})
        (step,) = next(client.sample("queue", timeout=T))
        assert step.data[0].tolist() == [0, 1, 2]
    finally:
        log = stop(proc, lines)
    assert "table 'replay'" in log and "stopped" in log


def test_checkpoints_survive_a_restart(tmp_path: pathlib.Path) -> None:
    config = dict(CONFIG, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_on_exit=True)
    proc, port, lines = start(config, tmp_path)
    try:
        reverb.Client(f"localhost:{port}").insert(np.float32(7), {"replay": 1.0})
    finally:
        log = stop(proc, lines)
    assert "checkpoint written to" in log
    proc, port, lines = start(config, tmp_path)
    try:
        client = reverb.Client(f"localhost:{port}")
        assert client.server_info(timeout=T)["replay"].current_size == 1
        (step,) = next(client.sample("replay", timeout=T))
        assert step.data[0] == 7
    finally:
        stop(proc, lines)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"tables": []}, "'tables' must be a non-empty list"),
        ({"tables": [{"max_size": 3}]}, "needs a 'name'"),
        ({"tables": [{"name": "t", "max_size": 3, "sampler": "random"}]}, "unknown selector"),
        ({"tables": [{"name": "t"}]}, r"tables\[0\] \(t\)"),
        ({"tables": [{"name": "t", "max_size": 3, "rate_limiter": {"x": 1}}]}, "unknown rate"),
    ],
)
def test_bad_configs_are_named(config: dict, message: str) -> None:
    with pytest.raises(server_main.ConfigError, match=message):
        server_main.tables_from_config(config)


def test_unreadable_config_exits_with_an_error(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    out = subprocess.run(
        [sys.executable, "-m", "reverb.server_main", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "not valid JSON" in out.stderr


# The reference's server takes its config as a ReverbServerConfig textproto.
TEXTPROTO = """
port: 0
tables {
  table_name: "replay"
  sampler { prioritized { priority_exponent: 0.8 } }
  remover { fifo: true }
  max_size: 100
  rate_limiter { samples_per_insert: 1.0 min_size_to_sample: 1 min_diff: -1e9 max_diff: 1e9 }
}
tables {
  table_name: "heap"
  sampler { heap { min_heap: true } }
  remover { lifo: true }
  max_size: 7
  max_times_sampled: 3
  rate_limiter { samples_per_insert: 1.0 min_size_to_sample: 1 min_diff: -1e9 max_diff: 1e9 }
}
"""


@pytest.mark.parametrize("as_file", [False, True])
def test_serves_tables_from_a_reference_textproto(tmp_path: pathlib.Path, as_file: bool) -> None:
    arg = TEXTPROTO
    if as_file:
        path = tmp_path / "config.textproto"
        path.write_text(TEXTPROTO)
        arg = str(path)
    proc, port, lines = start(arg, tmp_path)
    try:
        infos = reverb.Client(f"localhost:{port}").server_info(timeout=T)
        assert sorted(infos) == ["heap", "replay"]
        assert infos["replay"].sampler_options.prioritized.priority_exponent == pytest.approx(0.8)
        assert infos["heap"].sampler_options.heap.min_heap
        assert infos["heap"].remover_options.lifo
        assert infos["heap"].max_size == 7 and infos["heap"].max_times_sampled == 3
    finally:
        stop(proc, lines)


def test_tables_from_proto_as_the_reference() -> None:
    from google.protobuf import text_format

    from reverb.server_executable import reverb_config_pb2, server_from_proto

    config = text_format.Parse(TEXTPROTO, reverb_config_pb2.ReverbServerConfig())
    replay, heap = server_from_proto.tables_from_proto(config.tables)
    assert replay.name == "replay" and heap.info.max_size == 7
    selector = server_from_proto.selector_from_proto(config.tables[1].sampler)
    assert isinstance(selector, reverb.selectors.MinHeap)
    bad = config.tables[0].remover
    bad.fifo = False
    with pytest.raises(ValueError, match="distribution=fifo but the associated boolean"):
        server_from_proto.selector_from_proto(bad)


SIGNED_TEXTPROTO = """
tables {
  table_name: "signed"
  sampler { uniform: true }
  remover { fifo: true }
  max_size: 10
  rate_limiter { samples_per_insert: 1.0 min_size_to_sample: 1 min_diff: -1e9 max_diff: 1e9 }
  signature {
    dict_value {
      fields {
        key: "obs"
        value { tensor_spec_value { name: "obs" shape { dim { size: 3 } } dtype: DT_FLOAT } }
      }
    }
  }
}
"""


@pytest.mark.slow
def test_a_textproto_table_keeps_its_signature(tmp_path: pathlib.Path) -> None:
    tf = pytest.importorskip("tensorflow")
    proc, port, lines = start(SIGNED_TEXTPROTO, tmp_path)
    try:
        client = reverb.Client(f"localhost:{port}")
        info = client.server_info(timeout=T)["signed"]
        assert info.signature == {"obs": tf.TensorSpec([3], tf.float32, name="obs")}
        with pytest.raises(ValueError, match="signed"):
            client.insert({"obs": np.zeros(3, np.int32)}, {"signed": 1.0})
        client.insert({"obs": np.ones(3, np.float32)}, {"signed": 1.0})
        (step,) = next(client.sample("signed", timeout=T))
        assert step.data[0].tolist() == [1.0, 1.0, 1.0]
    finally:
        stop(proc, lines)


def test_a_textproto_signature_that_is_not_specs_is_named() -> None:
    bad = SIGNED_TEXTPROTO.replace(
        'tensor_spec_value { name: "obs" shape { dim { size: 3 } } dtype: DT_FLOAT }',
        "float64_value: 1.0",
    )
    out = subprocess.run(
        [sys.executable, "-m", "reverb.server_main", "--config", bad],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert "table 'signed'" in out.stderr and "not a tensor spec" in out.stderr


def test_a_malformed_textproto_exits_with_an_error() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "reverb.server_main", "--config", "tables { nope: 1 }"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "not a ReverbServerConfig textproto" in out.stderr
