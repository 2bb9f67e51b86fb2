"""TorchDataset: the sampler as a torch IterableDataset, with and without DataLoader workers.

Runs where PyTorch is installed: CI runs this file in its own virtualenv with torch
(tests/test_torch_rerun.py), since the main test environment has no torch.
"""

from __future__ import annotations

import numpy as np
import pytest

import reverb

torch = pytest.importorskip("torch")

T = 10.0


@pytest.fixture
def address(make_server) -> str:
    server = make_server([reverb.Table.queue("q", 1000)])
    client = server.localhost_client()
    with client.trajectory_writer(2) as writer:
        for t in range(21):
            writer.append({"obs": np.full(3, t, np.float32), "t": np.int64(t)})
            if t:
                writer.create_item(
                    "q", 1.0, {"obs": writer.history["obs"][-2:], "t": writer.history["t"][-1]}
                )
    return f"localhost:{server.port}"


def test_batches_are_torch_tensors_in_order(address) -> None:
    dataset = reverb.TorchDataset(address, "q", batch_size=4, max_samples=8)
    batches = list(dataset)
    assert len(batches) == 2
    first = batches[0]
    assert first.info.key.dtype == torch.uint64 and first.info.key.shape == (4,)
    assert first.info.times_sampled.dtype == torch.int32
    assert first.info.probability.dtype == torch.float64
    obs, t = first.data
    assert obs.dtype == torch.float32 and obs.shape == (4, 2, 3)
    assert t.dtype == torch.int64 and t.tolist() == [1, 2, 3, 4]
    assert obs[:, :, 0].tolist() == [[0, 1], [1, 2], [2, 3], [3, 4]]
    assert batches[1].data[1].tolist() == [5, 6, 7, 8]


def test_single_samples_and_a_clean_end_on_rate_limiter_timeout(address) -> None:
    dataset = reverb.TorchDataset(address, "q", rate_limiter_timeout_ms=200)
    got = [int(sample.data[1]) for sample in dataset]
    assert got == list(range(1, 21))  # every item once (a queue), then a clean end
    sample_info_key = reverb.TorchDataset(address, "q", rate_limiter_timeout_ms=50)
    assert list(sample_info_key) == []


def test_dataloader_workers_split_max_samples(address) -> None:
    dataset = reverb.TorchDataset(address, "q", batch_size=3, max_samples=20)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, timeout=T)
    got = sorted(t for batch in loader for t in batch.data[1].tolist())
    # Two forked workers, each with its own sampler and 10 of the 20 samples: nothing is
    # delivered twice and nothing is lost.
    assert got == list(range(1, 21))


def test_bad_arguments_are_value_errors(address) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        reverb.TorchDataset(address, "q", batch_size=0)
    with pytest.raises(ValueError, match="max_samples"):
        reverb.TorchDataset(address, "q", max_samples=0)
    with pytest.raises(reverb.errors.NotFoundError, match="nope"):
        list(reverb.TorchDataset(address, "nope", max_samples=1))
