"""Table signatures: nests of tf.TensorSpec carried as StructuredValue (needs TensorFlow)."""

from __future__ import annotations

import numpy as np
import pytest
from _no_tensorflow import run_without_tensorflow

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
    shapes = reverb.SampleInfo.tf_shapes()
    assert isinstance(shapes, reverb.SampleInfo)
    assert list(shapes) == [tf.TensorShape([])] * len(reverb.SampleInfo._fields)


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


def test_actors_check_items_against_signatures_without_tensorflow() -> None:
    """An actor process without TensorFlow (blocked here) checks every kind of write against
    the table signatures natively: refused items raise and are not stored, good ones are."""
    item_signature = {
        "obs": tf.TensorSpec([2, 3], tf.float32),
        "action": tf.TensorSpec([], tf.int64),
    }
    step_signature = {"obs": tf.TensorSpec([3], tf.float32), "action": tf.TensorSpec([], tf.int64)}
    with reverb.Server([_table("item", item_signature), _table("step", step_signature)]) as server:
        result = run_without_tensorflow(
            f"""
            import sys

            import numpy as np
            import pytest
            import reverb

            client = reverb.Client("localhost:{server.port}")
            step = {{"obs": np.zeros(3, np.float32), "action": np.int64(1)}}
            writer = client.trajectory_writer(2)
            for _ in range(2):
                writer.append(step)
            obs, action = writer.history["obs"], writer.history["action"]
            with pytest.raises(ValueError, match="expects column 0 to be a int64 \\[\\] "
                               "tensor but got a float \\[3\\] tensor"):
                writer.create_item("item", 1.0, {{"obs": obs[-2:], "action": obs[-1]}})
            with pytest.raises(reverb.errors.NotFoundError, match="no such table"):
                writer.create_item("nope", 1.0, {{"obs": obs[-2:], "action": action[-1]}})
            writer.create_item("item", 1.0, {{"obs": obs[-2:], "action": action[-1]}})
            writer.flush(timeout_ms=10_000)

            vector = client.vector_trajectory_writer(2, 2)
            vector.append({{"obs": np.zeros((2, 3), np.float32), "action": np.ones(2, np.int64)}})
            with pytest.raises(ValueError, match="inconsistent with the table signature"):
                vector.create_item("item", 1.0, {{"obs": vector.history["obs"][-1:],
                                                  "action": vector.history["action"][-1]}})
            vector.flush(timeout_ms=10_000)

            with pytest.raises(ValueError, match="flattened index 1"):
                client.insert({{"obs": np.zeros(4, np.float32), "action": np.int64(1)}},
                              {{"step": 1.0}})
            client.insert(step, {{"step": 1.0}})

            with client.writer(2) as legacy:
                legacy.append(step)
                with pytest.raises(ValueError, match="inconsistent with the table signature"):
                    legacy.create_item("item", 1, 1.0)
                legacy.append(step)
                legacy.create_item("item", 2, 1.0)

            assert "tensorflow" not in sys.modules, "an actor imported TensorFlow"
            print("ok")
            """
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "ok"
        infos = server.localhost_client().server_info(timeout=10)
        assert infos["item"].current_size == 2  # the trajectory writer's and the legacy one's
        assert infos["step"].current_size == 1
