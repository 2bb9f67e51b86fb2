"""The reference's native names that user code touches (`reverb.pybind`, `reverb.reverb_types`
aliases), and checkpointers built the way custom ones are in the reference."""

from __future__ import annotations

import pytest

import reverb
from reverb import pybind, reverb_types, selectors


def test_selector_classes_and_type_aliases() -> None:
    assert isinstance(selectors.MinHeap(), pybind.HeapSelector)
    assert isinstance(selectors.MaxHeap(), reverb_types.Heap)
    assert not isinstance(selectors.Fifo(), reverb_types.Heap)
    for name in ("Fifo", "Lifo", "Uniform", "Prioritized"):
        assert getattr(reverb_types, name) is getattr(selectors, name)
        assert getattr(pybind, f"{name}Selector") is getattr(selectors, name)
    assert set(reverb_types.SelectorType.__args__) == {
        selectors.Fifo,
        pybind.HeapSelector,
        selectors.Lifo,
        selectors.Prioritized,
        selectors.Uniform,
    }
    assert all(issubclass(c, pybind.ItemSelector) for c in reverb_types.SelectorType.__args__)
    assert pybind.Sampler.NUM_INFO_TENSORS == len(reverb.SampleInfo._fields)
    assert pybind.WeakCellRef is reverb.trajectory_writer.CellRef


def test_native_classes_behind_the_python_ones() -> None:
    table = reverb.Table.queue("q", 10)
    assert isinstance(table.internal_table, pybind.Table)
    limiter = reverb.rate_limiters.SampleToInsertRatio(2.0, 3, 10.0)
    assert isinstance(limiter.internal_limiter, pybind.RateLimiter)
    server = reverb.Server([table])
    try:
        client = server.localhost_client()
        assert isinstance(server._server, pybind.Server)
        assert isinstance(client._client, pybind.Client)
        writer = client.trajectory_writer(1)
        assert isinstance(writer._writer, pybind.TrajectoryWriter)
        writer.close()
        config = reverb.structured_writer.create_config(
            reverb.structured_writer.pattern_from_transform({"x": 0}, lambda s: s["x"][-1]), "q"
        )
        structured = client.structured_writer([config])
        assert isinstance(structured._writer, pybind.StructuredWriter)
    finally:
        server.stop()


def test_a_custom_checkpointer_made_as_in_the_reference(tmp_path) -> None:
    class GroupCheckpointer(reverb.checkpointers.CheckpointerBase):
        def internal_checkpointer(self) -> pybind.Checkpointer:
            return pybind.create_default_checkpointer(str(tmp_path), "group")

    server = reverb.Server([reverb.Table.queue("q", 10)], checkpointer=GroupCheckpointer())
    client = server.localhost_client()
    client.insert(1, {"q": 1.0})
    path = client.checkpoint()
    server.stop()
    assert path.startswith(str(tmp_path / "group"))
    restored = reverb.Server([reverb.Table.queue("q", 10)], checkpointer=GroupCheckpointer())
    assert restored.localhost_client().server_info()["q"].current_size == 1
    restored.stop()


def test_checkpointers_must_return_a_checkpointer() -> None:
    class Broken(reverb.checkpointers.CheckpointerBase):
        def internal_checkpointer(self):  # type: ignore[override]
            return ("/tmp", None, 1)

    with pytest.raises(TypeError, match="must return a reverb.pybind.Checkpointer"):
        reverb.Server([reverb.Table.queue("q", 10)], checkpointer=Broken())
    with pytest.raises(ValueError, match="keep_latest"):
        pybind.Checkpointer("/tmp", keep_latest=0)
    assert pybind.AutoTunedChunkerOptions(3).num_keep_alive_refs == 3
    assert pybind.ConstantChunkerOptions(2, 4).max_chunk_length == 2


def test_the_names_need_no_tensorflow() -> None:
    from _no_tensorflow import run_without_tensorflow

    result = run_without_tensorflow(
        """
        from reverb import pybind, reverb_types
        assert reverb_types.SelectorType and pybind.Sampler.NUM_INFO_TENSORS == 5
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_heap_selectors_made_as_in_the_reference() -> None:
    assert pybind.HeapSelector(True) == selectors.MinHeap()
    assert pybind.HeapSelector(False) == selectors.MaxHeap()
    table = reverb.Table(
        "t", pybind.HeapSelector(False), selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1)
    )
    assert table.info.sampler_options.heap.min_heap is False
