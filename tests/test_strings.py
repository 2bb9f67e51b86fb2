"""String tensors through every path data takes: numpy bytes_, str_ and object arrays (str
as UTF-8) in, object arrays of bytes out, tf.string in the TensorFlow ops and datasets; short
strings (held inline by TensorFlow) and long ones."""

from __future__ import annotations

import numpy as np
import pytest

import reverb
from reverb import structured_writer as sw

T = 10.0
LONG = "long " * 40  # beyond TensorFlow's inline strings (22 bytes)


def _sample_all(client: reverb.Client, table: str) -> list:
    n = client.server_info(timeout=T)[table].current_size
    return [
        [np.asarray(d).tolist() for d in s.data]
        for s in client.sample(table, n, emit_timesteps=False, timeout=T)
    ]


@pytest.fixture
def client(make_server, both_paths):
    return make_server([reverb.Table.queue("q", 100)]).localhost_client()


def test_insert_takes_every_kind_of_string_array(client) -> None:
    client.insert("plain str", {"q": 1.0}, timeout=T)
    client.insert(b"bytes \xff\x00 with a nul", {"q": 1.0}, timeout=T)
    client.insert(np.array([["a", "é"], ["", LONG]]), {"q": 1.0}, timeout=T)  # str_, 2-d
    client.insert(np.array([b"x", b"yz\x00"]), {"q": 1.0}, timeout=T)  # bytes_ (nul padded)
    client.insert(np.array([b"o", "mixed"], dtype=object), {"q": 1.0}, timeout=T)
    client.insert({"n": np.float32(2.5), "s": ["list", "of str"]}, {"q": 1.0}, timeout=T)
    got = _sample_all(client, "q")
    assert got == [  # each item holds one step: a leading dimension of 1
        [[b"plain str"]],
        [[b"bytes \xff\x00 with a nul"]],
        [[[[b"a", "é".encode()], [b"", LONG.encode()]]]],
        [[[b"x", b"yz"]]],  # numpy drops a bytes_ array's trailing nuls, as everywhere
        [[[b"o", b"mixed"]]],
        [[2.5], [b"list"], [b"of str"]],  # a list is a nest of two leaves
    ]


def test_trailing_nul_bytes_of_python_bytes_are_kept(client) -> None:
    """A Python bytes value keeps its trailing NULs (as TensorFlow's strings do) through
    `insert` and the trajectory writer; numpy's fixed-width bytes_ would drop them."""
    client.insert(b"end\x00\x00", {"q": 1.0}, timeout=T)
    with client.trajectory_writer(1) as w:
        w.append({"s": b"ab\x00"})
        w.create_item("q", 1.0, {"s": w.history["s"][-1]})
        w.flush(timeout_ms=int(T * 1000))
    assert _sample_all(client, "q") == [[[b"end\x00\x00"]], [b"ab\x00"]]


def test_sampled_strings_are_object_arrays_of_bytes(client) -> None:
    client.insert(np.array(["a", "b"]), {"q": 1.0}, timeout=T)
    [sample] = list(client.sample("q", 1, emit_timesteps=False, timeout=T))
    column = sample.data[0]
    assert column.dtype == object and column.shape == (1, 2)
    assert column.tolist() == [[b"a", b"b"]]


def test_objects_that_are_not_strings_are_refused(client) -> None:
    with pytest.raises(ValueError, match="Unsupported object of type int"):
        client.insert(np.array([b"ok", 3], dtype=object), {"q": 1.0}, timeout=T)
    assert client.server_info(timeout=T)["q"].current_size == 0


def test_trajectory_writer_items_span_chunks_and_history_reads_strings(client) -> None:
    writer = client.trajectory_writer(4)
    words = [f"w{i}" + "!" * (i * 20) for i in range(7)]
    for i, word in enumerate(words):
        writer.append({"w": word, "pair": np.array([word, "x"]), "i": np.int32(i)})
        # Open and finalized chunks read back the same.
        assert writer.history["w"][-1].numpy() == word.encode()
        if i >= 2:
            writer.create_item(
                "q", 1.0, {"w": writer.history["w"][-3:], "pair": writer.history["pair"][-1]}
            )
    assert writer.history["w"][-4].numpy() == words[-4].encode()
    writer.end_episode()
    writer.flush(timeout_ms=10_000)
    writer.close()
    got = _sample_all(client, "q")
    assert (
        got
        == [  # columns in key order: "pair", then "w"
            [[words[i].encode(), b"x"], [w.encode() for w in words[i - 2 : i + 1]]]
            for i in range(2, 7)
        ]
    )


def test_a_string_leaf_must_keep_its_shape(client) -> None:
    writer = client.trajectory_writer(2)
    writer.append({"s": np.array(["a", "b"])})
    with pytest.raises(ValueError, match=r"incompatible shape.*Got \[3\]"):
        writer.append({"s": np.array(["a", "b", "c"])})
    with pytest.raises(ValueError, match="wrong dtype.*Got int32 but expected string"):
        writer.append({"s": np.array([1, 2], np.int32)})
    writer.close()


def test_structured_and_legacy_writers_write_strings(client) -> None:
    ref = sw.create_reference_step({"o": np.float32(0), "t": "x"})
    pattern = sw.pattern_from_transform(ref, lambda x: {"t": x["t"][-2:], "o": x["o"][-1]})
    with client.structured_writer([sw.create_config(pattern, "q")]) as writer:
        for i in range(3):
            writer.append({"o": np.float32(i), "t": f"word{i}"})
    with client.writer(2) as legacy:
        legacy.append({"a": "legacy", "b": np.int32(1)})
        legacy.append({"a": LONG, "b": np.int32(2)})
        legacy.create_item("q", 2, 1.0)
    assert _sample_all(client, "q") == [
        [1.0, [b"word0", b"word1"]],
        [2.0, [b"word1", b"word2"]],
        [[b"legacy", LONG.encode()], [1, 2]],
    ]


def test_trajectory_iterator_batches_strings(client) -> None:
    for word in ("one", LONG):
        client.insert({"n": np.float32(1), "s": word}, {"q": 1.0}, timeout=T)
    address = client.server_address
    with reverb.TrajectoryIterator(address, "q", batch_size=2, max_samples=2) as it:
        batch = next(it)
    assert batch.data[1].dtype == object
    assert batch.data[1].tolist() == [[b"one"], [LONG.encode()]]


def test_vectorised_appends_of_strings_are_refused_clearly(client) -> None:
    writer = client.trajectory_writer(2)
    with pytest.raises(Exception, match="append_steps does not take string values"):
        writer.append_steps({"s": np.array(["a", "b"])})
    writer.close()


def test_signatures_with_string_specs_check_and_datasets_read_them(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    signature = {"text": tf.TensorSpec([], tf.string), "tags": tf.TensorSpec([2], tf.string)}
    server = make_server([reverb.Table.queue("sig", 100, signature=signature)])
    client = server.localhost_client()
    address = f"localhost:{server.port}"
    client.insert({"text": "hello", "tags": np.array([b"a", LONG.encode()])}, {"sig": 1.0})
    with pytest.raises(ValueError, match="dtype float, shape \\[\\], but expected tensor 'text'"):
        client.insert({"text": np.float32(1), "tags": np.array(["a", "b"])}, {"sig": 1.0})
    tf_client = reverb.TFClient(address)
    tf_client.insert(
        [tf.constant(["p", "q" * 40]), tf.constant("via tf")],
        tf.constant(["sig"]),
        tf.constant([1.0], tf.float64),
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="dtype string, shape \\[\\]"):
        tf_client.insert(
            [tf.constant("one"), tf.constant("via tf")],
            tf.constant(["sig"]),
            tf.constant([1.0], tf.float64),
        )
    dataset = reverb.TimestepDataset.from_table_signature(
        address, "sig", max_in_flight_samples_per_worker=1
    )
    got = [(s.data["text"].numpy(), s.data["tags"].numpy().tolist()) for s in dataset.take(2)]
    assert got == [(b"hello", [b"a", LONG.encode()]), (b"via tf", [b"p", b"q" * 40])]


def test_trajectory_dataset_and_tf_client_sample_strings(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    table = reverb.Table(
        "seq",
        reverb.selectors.Fifo(),
        reverb.selectors.Fifo(),
        100,
        reverb.rate_limiters.MinSize(1),
    )
    server = make_server([table])
    client = server.localhost_client()
    address = f"localhost:{server.port}"
    for episode in range(2):
        writer = client.trajectory_writer(3)
        for i in range(3):
            writer.append({"t": f"e{episode} s{i}" + "x" * (10 * i)})
        writer.create_item("seq", 1.0, {"t": writer.history["t"][-3:]})
        writer.end_episode()
        writer.flush(timeout_ms=10_000)
        writer.close()
    dataset = reverb.TrajectoryDataset(
        address,
        "seq",
        dtypes=(tf.string,),
        shapes=(tf.TensorShape([3]),),
        max_in_flight_samples_per_worker=1,
    )
    [first] = [s.data[0].numpy().tolist() for s in dataset.take(1)]
    assert first == [b"e0 s0", b"e0 s1" + b"x" * 10, b"e0 s2" + b"x" * 20]
    sample = reverb.TFClient(address).sample("seq", [tf.string])
    assert sample.data[0].numpy() == b"e0 s0"  # the first step, as the reference's
