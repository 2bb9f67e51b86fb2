"""Wire compatibility with the reference (dm-reverb 0.14): its client against our server and
our client against its server. Runs when REVERB_REFERENCE_PYTHON names a Python with dm-reverb
0.14.0 and TensorFlow installed (`python bench/run.py --make-reference-venv DIR` builds one)."""

from __future__ import annotations

import subprocess
import textwrap

import _reference as reference
import numpy as np
import pytest

import reverb

pytestmark = pytest.mark.skipif(not reference.PYTHON, reason="REVERB_REFERENCE_PYTHON is not set")


def _fifo(name: str) -> reverb.Table:
    return reverb.Table(
        name,
        reverb.selectors.Fifo(),
        reverb.selectors.Fifo(),
        100,
        reverb.rate_limiters.MinSize(1),
        max_times_sampled=1,
    )


def test_reference_client_against_our_server(make_server) -> None:
    server = make_server([_fifo("t")])
    script = textwrap.dedent(
        f"""
        import numpy as np, reverb
        c = reverb.Client("localhost:{server.port}")
        assert sorted(c.server_info(timeout=10)) == ["t"]
        c.insert([np.arange(3, dtype=np.int32), np.float32(2.5)], {{"t": 1.0}})
        with c.trajectory_writer(num_keep_alive_refs=3) as w:
            for i in range(3):
                w.append({{"a": np.full(2, i, np.int64)}})
            w.create_item("t", 2.0, {{"a": w.history["a"][:]}})
        print("done")
        """
    )
    reference.run("-c", script)
    client = server.localhost_client()
    first, second = client.sample("t", 2, emit_timesteps=False, timeout=10)
    np.testing.assert_array_equal(first.data[0], [[0, 1, 2]])
    np.testing.assert_array_equal(first.data[1], [2.5])
    np.testing.assert_array_equal(second.data[0], [[0, 0], [1, 1], [2, 2]])
    assert second.info.priority == 2.0


def test_our_client_against_reference_server() -> None:
    tables = """[reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 100,
                             reverb.rate_limiters.MinSize(1), max_times_sampled=1)]"""
    with reference.server(tables) as port:
        client = reverb.Client(f"localhost:{port}")
        assert list(client.server_info(timeout=10)) == ["t"]
        client.insert({"x": np.arange(4, dtype=np.float64)}, {"t": 1.0}, timeout=10)
        with client.trajectory_writer(2) as writer:
            writer.append({"y": np.int16(7)})
            writer.append({"y": np.int16(8)})
            writer.create_item("t", 3.0, writer.history["y"][:])
        first, second = client.sample("t", 2, emit_timesteps=False, timeout=10)
        np.testing.assert_array_equal(first.data[0], [[0.0, 1.0, 2.0, 3.0]])
        np.testing.assert_array_equal(second.data[0], [7, 8])
        assert second.info.priority == 3.0
        # Strings, short and longer than TensorFlow keeps inline, through the reference server.
        client.insert({"s": np.array(["a", "b" * 40])}, {"t": 1.0}, timeout=10)
        with client.trajectory_writer(2) as writer:
            writer.append({"w": "one"})
            writer.append({"w": "two" * 10})
            writer.create_item("t", 1.0, writer.history["w"][:])
        strings = [s.data[0].tolist() for s in client.sample("t", 2, emit_timesteps=False)]
        assert strings == [[[b"a", b"b" * 40]], [b"one", b"two" * 10]]
        # A sampler's stream (which offers a shared-memory ring the reference ignores), with
        # chunks big enough for the ring: they come inline, whole.
        frames = np.random.default_rng(0).integers(0, 256, (3, 64, 64), dtype=np.uint8)
        for frame in frames:
            client.insert(frame, {"t": 1.0}, timeout=10)
        iterator = reverb.TrajectoryIterator(
            f"localhost:{port}", "t", batch_size=3, max_samples=3, rate_limiter_timeout_ms=5000
        )
        (batch,) = list(iterator)
        np.testing.assert_array_equal(batch.data[0][:, 0], frames)
        # A batched insert: its item runs are ours only (the reference's ServerInfo lists no
        # features), so the items go one message each.
        client.insert_steps({"v": np.arange(5, dtype=np.int32)}, {"t": 2.0}, timeout=10)
        got = client.sample("t", 5, emit_timesteps=False, timeout=10)
        assert [int(s.data[0][0]) for s in got] == [0, 1, 2, 3, 4]
        # A batch writer does the same, a batch stored before its call returns.
        with client.batch_writer() as writer:
            writer.insert_steps({"v": np.arange(3, dtype=np.int32)}, {"t": 1.0}, timeout=10)
            writer.insert_steps({"v": np.arange(3, 5, dtype=np.int32)}, {"t": 1.0}, timeout=10)
        got = client.sample("t", 5, emit_timesteps=False, timeout=10)
        assert [int(s.data[0][0]) for s in got] == [0, 1, 2, 3, 4]


def test_structured_writer_configs_are_the_references_messages() -> None:
    """Configs built by dm-reverb's helpers parse as ours and unpack to the same pattern, and
    ours parse there: the same messages, field numbers and structure encoding."""
    import base64

    from reverb import structured_writer as sw
    from reverb.cc import patterns_pb2

    script = textwrap.dedent(
        """
        import base64, sys
        from reverb import structured_writer as sw
        from reverb.cc import patterns_pb2
        step = {"obs": None, "action": None, "td": None}
        ref = sw.create_reference_step(step)
        pattern = {"obs": ref["obs"][-3:], "action": ref["action"][-2], "td": ref["td"][-6::2]}
        cond = [sw.Condition.step_index() % 2 == 1, sw.Condition.steps_since_applied() >= 3]
        config = sw.create_config(pattern, "replay", conditions=cond)
        print(base64.b64encode(config.SerializeToString()).decode())
        ours = patterns_pb2.StructuredWriterConfig.FromString(base64.b64decode(sys.argv[1]))
        unpacked = sw.unpack_pattern(ours)
        assert unpacked["obs"].start == -3 and unpacked["td"].step == 2, unpacked
        print("ok")
        """
    )
    step = {"obs": None, "action": None, "td": None}
    ref = sw.create_reference_step(step)
    pattern = {"obs": ref["obs"][-3:], "action": ref["action"][-2], "td": ref["td"][-6::2]}
    conditions = [sw.Condition.step_index() % 2 == 1, sw.Condition.steps_since_applied() >= 3]
    ours = sw.create_config(pattern, "replay", conditions=conditions)
    encoded = base64.b64encode(ours.SerializeToString()).decode()
    out = reference.run("-c", script, encoded)
    theirs_bytes, ok = out.stdout.split()
    assert ok == "ok"
    theirs = patterns_pb2.StructuredWriterConfig.FromString(base64.b64decode(theirs_bytes))
    assert sw.unpack_pattern(theirs) == pattern
    assert list(theirs.conditions) == conditions
    assert list(theirs.flat) == list(ours.flat) and theirs.table == ours.table
    assert theirs.priority == ours.priority  # constant 1.0 by default, in both


def _reference_results(scenario_file: str) -> dict:
    """What a scenario file of tests/ prints (its RESULTS JSON) when dm-reverb runs it."""
    import json
    import pathlib

    script = pathlib.Path(__file__).with_name(scenario_file)
    out = reference.run(str(script), timeout=300)
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULTS")]
    return json.loads(line[len("RESULTS") :])


def test_structured_writer_scenarios_insert_what_the_reference_inserts() -> None:
    """Every scenario of tests/_structured_scenarios.py, run by dm-reverb's StructuredWriter on
    its server, inserts exactly the items ours does."""

    from _structured_scenarios import SCENARIOS, run

    theirs = _reference_results("_structured_scenarios.py")
    assert sorted(theirs) == sorted(SCENARIOS)
    for name, scenario in SCENARIOS.items():
        assert run(*scenario) == theirs[name], name


@pytest.mark.slow
def test_reference_reads_what_our_structured_writer_wrote(make_server) -> None:
    """Items from our StructuredWriter (an N-step transition pattern, table with the signature
    infer_signature gives) read by dm-reverb's client and its TrajectoryDataset."""
    import tensorflow as tf

    from reverb import structured_writer as sw

    step = {"obs": np.zeros(3, np.float32), "reward": np.float32(0)}
    ref = sw.create_reference_step(step)
    pattern = {"obs": ref["obs"][-3], "next": ref["obs"][-1], "rewards": ref["reward"][-3:-1]}
    configs = [sw.create_config(pattern, "t", [sw.Condition.step_index() >= 2])]
    spec = tf.nest.map_structure(lambda x: tf.TensorSpec(x.shape, x.dtype), step)
    signature = sw.infer_signature(configs, spec)
    server = make_server([reverb.Table.queue("t", 100, signature=signature)])
    with server.localhost_client().structured_writer(configs) as writer:
        for i in range(6):
            writer.append({"obs": np.full(3, i, np.float32), "reward": np.float32(i / 2)})
    script = textwrap.dedent(
        f"""
        import numpy as np, reverb
        c = reverb.Client("localhost:{server.port}")
        assert c.server_info(timeout=10)["t"].current_size == 4
        ds = reverb.TrajectoryDataset.from_table_signature(
            f"localhost:{server.port}", "t", max_in_flight_samples_per_worker=1)
        samples = list(ds.take(4))
        assert len(samples) == 4, len(samples)
        for i, s in enumerate(samples):
            np.testing.assert_array_equal(s.data["obs"], np.full(3, i, np.float32))
            np.testing.assert_array_equal(s.data["next"], np.full(3, i + 2, np.float32))
            np.testing.assert_allclose(s.data["rewards"], [i / 2, (i + 1) / 2])
        print("ok")
        """
    )
    out = reference.run("-c", script)
    assert out.stdout.split()[-1] == "ok"


@pytest.mark.slow
def test_pattern_dataset_scenarios_give_what_the_references_gives() -> None:
    """Every scenario of tests/_pattern_scenarios.py through dm-reverb's PatternDataset gives
    exactly the trajectories ours gives."""

    pytest.importorskip("tensorflow")
    from _pattern_scenarios import SCENARIOS, run

    theirs = _reference_results("_pattern_scenarios.py")
    assert sorted(theirs) == sorted(SCENARIOS)
    for name, scenario in SCENARIOS.items():
        assert run(*scenario) == theirs[name], name


def test_legacy_writers_both_ways(make_server) -> None:
    """dm-reverb's legacy Writer into our server, and ours read by dm-reverb's client."""
    server = make_server([_fifo("theirs"), _fifo("ours")])
    with server.localhost_client().writer(3) as writer:
        for i in range(3):
            writer.append({"x": np.full(2, i, np.int32)})
        writer.create_item("ours", 3, 1.5)
    script = textwrap.dedent(
        f"""
        import numpy as np, reverb
        c = reverb.Client("localhost:{server.port}")
        with c.writer(2) as w:
            w.append([np.float32(1)])
            w.append([np.float32(2)])
            w.create_item("theirs", 2, 1.0)
        (s,) = c.sample("ours", 1, emit_timesteps=False)
        np.testing.assert_array_equal(s.data[0], [[0, 0], [1, 1], [2, 2]])
        assert s.info.priority == 1.5
        print("ok")
        """
    )
    out = reference.run("-c", script)
    assert out.stdout.split()[-1] == "ok"
    (sample,) = server.localhost_client().sample("theirs", 1, emit_timesteps=False, timeout=10)
    np.testing.assert_array_equal(sample.data[0], [1, 2])


# Where our error differs from dm-reverb's on purpose (the README's Differences list them).
DELIBERATE_ERROR_DIFFERENCES = {
    "Queue(0)": "we refuse a queue that can never hold an item",
    "Stack(0)": "we refuse a stack that can never hold an item",
    "Prioritized(-1)": "we refuse a negative priority exponent",
    "sample num_samples=0": "the reference's message names max_samples",
    "legacy create_item 0": "the reference prints a literal %d",
}


@pytest.mark.slow
def test_error_texts_are_the_references() -> None:
    """Each case of tests/_error_texts.py fails with the same kind of error and the same first
    sentence under dm-reverb and under this package (extra detail may follow it)."""
    import json
    import pathlib
    import sys

    theirs = _reference_results("_error_texts.py")
    script = pathlib.Path(__file__).with_name("_error_texts.py")
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=reference.QUIET,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULTS")]
    ours = json.loads(line[len("RESULTS") :])
    assert sorted(ours) == sorted(theirs)
    differ = {
        case: (theirs[case], ours[case])
        for case in theirs
        if case not in DELIBERATE_ERROR_DIFFERENCES and theirs[case] != ours[case]
    }
    assert not differ, differ


def test_strings_both_ways(make_server) -> None:
    """String tensors as the reference carries them: dm-reverb's writers into our server read
    by ours, and ours read by dm-reverb (short strings and ones longer than TensorFlow keeps
    inline; bytes, str and object arrays)."""
    server = make_server([reverb.Table.queue("q", 100)])
    address = f"localhost:{server.port}"
    write = textwrap.dedent(
        f"""
        import numpy as np, reverb
        c = reverb.Client("{address}")
        c.insert([np.array([b"ref", b"strings"]), np.int32(3)], {{"q": 1.0}})
        with c.trajectory_writer(2) as w:
            for i in range(3):
                w.append({{"s": ("r%d" % i).encode() * (i * 10 + 1),
                          "u": np.array(["uni", "é"], dtype=object)}})
            w.create_item("q", 1.0, {{"s": w.history["s"][-2:], "u": w.history["u"][-1]}})
        """
    )
    reference.run("-c", write)
    client = server.localhost_client()
    got = [
        [d.tolist() for d in s.data]
        for s in client.sample("q", 2, emit_timesteps=False, timeout=10)
    ]
    assert got == [
        [[[b"ref", b"strings"]], [3]],
        [[b"r1" * 11, b"r2" * 21], [b"uni", "é".encode()]],
    ]
    client.insert([np.array(["ours", "x" * 50]), np.int32(1)], {"q": 1.0}, timeout=10)
    writer = client.trajectory_writer(2)
    for i in range(3):
        writer.append({"s": f"o{i}" * (i * 10 + 1)})
    writer.create_item("q", 1.0, {"s": writer.history["s"][-2:]})
    writer.end_episode()
    writer.flush(timeout_ms=10_000)
    writer.close()
    read = textwrap.dedent(
        f"""
        import reverb
        c = reverb.Client("{address}")
        for s in c.sample("q", 2, emit_timesteps=False):
            print("GOT", [d.tolist() for d in s.data])
        """
    )
    out = reference.run("-c", read)
    lines = [line for line in out.stdout.splitlines() if line.startswith("GOT")]
    assert lines == [
        "GOT " + repr([[[b"ours", b"x" * 50]], [1]]),
        "GOT " + repr([[b"o1" * 11, b"o2" * 21]]),
    ]
