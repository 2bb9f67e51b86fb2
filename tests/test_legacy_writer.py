"""The legacy `Writer` (`Client.writer`): items of the newest steps read back exactly, sequences,
argument checks with the reference's messages, signatures, context manager and close."""

from __future__ import annotations

import numpy as np
import pytest

import reverb

T = 10.0


def _client(make_server, *tables: reverb.Table) -> reverb.Client:
    server = make_server(list(tables) or [reverb.Table.queue("q", 100)])
    return server.localhost_client()


def _items(client: reverb.Client, table: str = "q") -> list:
    n = client.server_info(timeout=T)[table].current_size
    if not n:
        return []
    return [s.data for s in client.sample(table, n, emit_timesteps=False, timeout=T)]


def test_items_are_the_newest_steps_of_every_leaf(make_server, both_paths) -> None:
    client = _client(make_server)
    with client.writer(max_sequence_length=3) as writer:
        for i in range(5):
            writer.append({"obs": np.full(2, i, np.float32), "action": np.int64(i)})
            if i >= 1:
                writer.create_item("q", num_timesteps=min(i + 1, 3), priority=float(i))
    got = _items(client)
    assert len(got) == 4
    action, obs = got[0]  # flattened: action, obs
    np.testing.assert_array_equal(action, [0, 1])
    np.testing.assert_array_equal(obs, [[0, 0], [1, 1]])
    action, obs = got[-1]
    np.testing.assert_array_equal(action, [2, 3, 4])
    assert obs.shape == (3, 2)


def test_append_sequence_is_several_appends(make_server) -> None:
    client = _client(make_server)
    with client.writer(2) as writer:
        writer.append_sequence([np.array([[1, 2, 3], [4, 5, 6]], np.int32)])
        writer.create_item("q", num_timesteps=1, priority=1.0)
        writer.create_item("q", num_timesteps=2, priority=1.0)
    first, second = _items(client)
    np.testing.assert_array_equal(first[0], [[4, 5, 6]])
    np.testing.assert_array_equal(second[0], [[1, 2, 3], [4, 5, 6]])


def test_a_pushed_variable_as_tf_agents_does(make_server) -> None:
    client = _client(make_server, reverb.Table.queue("variables", 1))
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.int64(7)}
    with client.writer(1) as writer:
        writer.append(weights)
        writer.create_item("variables", 1, 1.0)
    (sample,) = client.sample("variables", 1, emit_timesteps=False, timeout=T)
    step, w = sample.data
    np.testing.assert_array_equal(step, [7])
    np.testing.assert_array_equal(w, [weights["w"]])


def test_argument_checks_say_what_the_reference_says(make_server) -> None:
    client = _client(make_server)
    with pytest.raises(ValueError, match=r"max_sequence_length \(0\) must be a positive integer"):
        client.writer(0)
    with pytest.raises(ValueError, match=r"chunk_length \(4\) must be a positive integer le to"):
        client.writer(3, chunk_length=4)
    with pytest.raises(ValueError, match=r"chunk_length \(0\)"):
        client.writer(3, chunk_length=0)
    with pytest.raises(ValueError, match=r"max_in_flight_items \(0\) must be a positive"):
        client.writer(3, max_in_flight_items=0)
    writer = client.writer(3)
    writer.append([np.float32(1)])
    with pytest.raises(ValueError, match=r"num_timesteps \(0\) must be a positive integer"):
        writer.create_item("q", 0, 1.0)
    with pytest.raises(ValueError, match="larger than number of buffered timesteps"):
        writer.create_item("q", 2, 1.0)
    with pytest.raises(ValueError, match="Previously it was 1, but is now 2"):
        writer.append([np.float32(1), np.float32(2)])
    with pytest.raises(ValueError, match="wrong dtype"):
        writer.append([np.int32(1)])
    with pytest.raises(
        ValueError, match="table .nope. in signature cache.  Available tables: \\[.q.\\]"
    ):
        writer.create_item("nope", 1, 1.0)
    writer.create_item("q", 1, 1.0)
    writer.close()
    with pytest.raises(ValueError, match="close\\(\\) has already been called"):
        writer.close()
    with pytest.raises(ValueError, match="Cannot reuse already closed Writer"):
        with writer:
            pass
    assert len(_items(client)) == 1
    assert "max_timesteps=3" in repr(writer)


def test_items_must_match_the_table_signature(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    table = reverb.Table.queue("q", 10, signature={"x": tf.TensorSpec([None, 2], tf.float32)})
    client = _client(make_server, table)
    writer = client.writer(2)
    writer.append({"x": np.zeros(3, np.float32)})
    with pytest.raises(
        ValueError, match="inconsistent with the table signature.*flattened index 0"
    ):
        writer.create_item("q", 1, 1.0)
    good = client.writer(2)
    good.append({"x": np.zeros(2, np.float32)})
    good.create_item("q", 1, 1.0)
    good.close()
    writer.close()
    assert len(_items(client)) == 1


def test_a_signature_of_one_step_accepts_items_of_several(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    table = reverb.Table.queue("q", 10, signature={"x": tf.TensorSpec([2], tf.float32)})
    client = _client(make_server, table)
    with client.writer(3) as writer:
        for i in range(3):
            writer.append({"x": np.full(2, i, np.float32)})
        writer.create_item("q", 3, 1.0)
        writer.create_item("q", 1, 1.0)
    with client.writer(1) as bad:
        bad.append({"x": np.zeros(2, np.float64)})
        with pytest.raises(
            ValueError, match=r"dtype double, shape \[2\], but expected tensor 'x' of dtype float"
        ):
            bad.create_item("q", 1, 1.0)
    assert len(_items(client)) == 2


def test_each_item_length_is_checked_and_refusals_repeat(make_server) -> None:
    # The check of a (table, num_timesteps) is done once it passed: a different length, or
    # another table, is checked again, and a refused length is refused every time.
    tf = pytest.importorskip("tensorflow")
    signed = reverb.Table.queue("q", 10, signature={"x": tf.TensorSpec([2, 2], tf.float32)})
    plain = reverb.Table.queue("p", 10)
    client = _client(make_server, signed, plain)
    with client.writer(3) as writer:
        for i in range(3):
            writer.append({"x": np.full(2, i, np.float32)})
            if i:
                writer.create_item("q", 2, 1.0)
        for _ in range(2):
            with pytest.raises(ValueError, match="inconsistent with the table signature"):
                writer.create_item("q", 3, 1.0)
        writer.create_item("p", 3, 1.0)
        writer.create_item("q", 2, 1.0)
        # The table is part of the key: an unsigned table's items do not vouch for the
        # signed one's.
        writer.create_item("p", 3, 1.0)
        with pytest.raises(ValueError, match="inconsistent with the table signature"):
            writer.create_item("q", 3, 1.0)
    assert [item[0].shape for item in _items(client)] == [(2, 2)] * 3
    assert [item[0].shape for item in _items(client, "p")] == [(3, 2)] * 2


def test_a_new_structure_of_the_same_width_is_checked_again(make_server) -> None:
    tf = pytest.importorskip("tensorflow")
    signed = reverb.Table.queue("q", 10, signature={"x": tf.TensorSpec([], tf.float32)})
    client = _client(make_server, signed)
    with client.writer(3) as writer:
        writer.append({"x": np.float32(1)})
        writer.create_item("q", 1, 1.0)
        # Same number of leaves, another key: another column, of another dtype.
        writer.append({"y": np.int32(1)})
        with pytest.raises(ValueError, match="2 tensors, but table requires 1"):
            writer.create_item("q", 1, 1.0)
    assert len(_items(client)) == 1


def test_a_nested_value_under_the_same_keys_changes_the_width(make_server) -> None:
    client = _client(make_server)
    with client.writer(2) as writer:
        writer.append({"a": np.zeros(2, np.float32), "b": np.float32(0)})
        with pytest.raises(ValueError, match="Previously it was 2, but is now 3"):
            writer.append({"a": [np.float32(1), np.float32(2)], "b": np.float32(1)})
        with pytest.raises(ValueError, match="Previously it was 2, but is now 1"):
            writer.append_sequence({"a": np.ones((1, 2), np.float32)})
        writer.append({"a": np.ones(2, np.float32), "b": np.float32(1)})
        writer.create_item("q", 2, 1.0)
    [item] = _items(client)
    assert item[0].tolist() == [[0.0, 0.0], [1.0, 1.0]]
