"""Table signatures: nests of tf.TensorSpec carried as StructuredValue (needs TensorFlow)."""

from __future__ import annotations

import numpy as np
import pytest

import reverb

tf = pytest.importorskip("tensorflow")


def _table(name: str, signature: object) -> reverb.Table:
    return reverb.Table(
        name,
        reverb.selectors.Fifo(),
        reverb.selectors.Fifo(),
        10,
        reverb.rate_limiters.MinSize(1),
        signature=signature,
    )


def test_signature_round_trips_through_table_info_and_server_info() -> None:
    signature = {
        "obs": tf.TensorSpec([None, 8], tf.float32, name="observation"),
        "extras": (tf.TensorSpec([], tf.int64), tf.TensorSpec([2, 2], tf.uint8)),
    }
    table = _table("sig", signature)
    assert table.info.signature == signature
    with reverb.Server([table, _table("plain", None)]) as server:
        infos = server.localhost_client().server_info(timeout=10)
        assert infos["sig"].signature == signature
        assert infos["plain"].signature is None


def test_bounded_specs_are_accepted() -> None:
    from tensorflow.python.framework import tensor_spec

    bounded = tensor_spec.BoundedTensorSpec([3], tf.float32, minimum=0.0, maximum=1.0)
    assert _table("b", {"x": bounded}).info.signature["x"].shape == (3,)


def test_non_spec_leaves_are_rejected() -> None:
    with pytest.raises(ValueError, match="Unsupported signature spec"):
        _table("bad", {"a": tf.TensorSpec([], tf.int32), "b": 3})


def test_sample_unpacks_as_table_signature() -> None:
    signature = {"obs": tf.TensorSpec([3], tf.float32), "action": tf.TensorSpec([], tf.int32)}
    with reverb.Server([_table("sig", signature)]) as server:
        client = server.localhost_client()
        client.insert({"obs": np.arange(3, dtype=np.float32), "action": np.int32(4)}, {"sig": 1.0})
        (step,) = next(client.sample("sig", unpack_as_table_signature=True, timeout=10))
        assert set(step.data) == {"obs", "action"}
        np.testing.assert_array_equal(step.data["obs"], [0.0, 1.0, 2.0])
        assert step.data["action"] == 4
        # Without unpacking, data is the flat list in sorted-key order (action, obs).
        (flat,) = next(client.sample("sig", timeout=10))
        assert isinstance(flat.data, list) and flat.data[0] == 4


def test_sample_info_tf_helpers() -> None:
    assert reverb.SampleInfo.tf_dtypes() == reverb.SampleInfo(
        tf.uint64, tf.double, tf.int64, tf.double, tf.int32
    )
    zeros = reverb.SampleInfo.zeros()
    assert [int(z.numpy()) for z in zeros] == [0, 0, 0, 0, 0]
    assert all(s == tf.TensorShape([]) for s in reverb.SampleInfo.tf_shapes())


def test_trajectory_writer_validates_items_against_the_signature() -> None:
    signature = {"obs": tf.TensorSpec([2, 3], tf.float32), "action": tf.TensorSpec([], tf.int64)}
    with reverb.Server([_table("sig", signature)]) as server:
        client = server.localhost_client()
        writer = client.trajectory_writer(2)
        for _ in range(2):
            writer.append({"obs": np.zeros(3, np.float32), "action": np.int64(1)})
        good = {"obs": writer.history["obs"][-2:], "action": writer.history["action"][-1]}
        writer.create_item("sig", 1.0, good)
        bad_dtype = {"obs": writer.history["obs"][-2:], "action": writer.history["obs"][-1]}
        with pytest.raises(ValueError, match="inconsistent with the table signature"):
            writer.create_item("sig", 1.0, bad_dtype)
        bad_shape = {"obs": writer.history["obs"][-1:], "action": writer.history["action"][-1]}
        expected = r"expects column 1 to be a float \[2, 3\] tensor but got a float \[1, 3\] tensor"
        with pytest.raises(ValueError, match=expected):
            writer.create_item("sig", 1.0, bad_shape)
        # validate_items=False sends it anyway (the server does not check signatures).
        unchecked = client.trajectory_writer(2, validate_items=False)
        unchecked.append({"obs": np.zeros(3, np.float32), "action": np.int64(1)})
        unchecked.create_item(
            "sig",
            1.0,
            {"obs": unchecked.history["obs"][-1:], "action": unchecked.history["action"][-1]},
        )
        writer.flush(timeout_ms=10_000)
        unchecked.flush(timeout_ms=10_000)
        assert client.server_info(timeout=10)["sig"].current_size == 2
