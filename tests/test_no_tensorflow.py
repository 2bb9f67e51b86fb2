"""`import reverb` and the whole non-TF API work when TensorFlow cannot be imported."""

from __future__ import annotations

from _no_tensorflow import run_without_tensorflow


def test_reverb_works_without_tensorflow() -> None:
    result = run_without_tensorflow(
        """
        import sys

        import numpy as np
        import reverb

        server = reverb.Server([reverb.Table.queue("q", 10)])
        client = reverb.Client(f"localhost:{server.port}")
        client.insert({"x": np.arange(3)}, {"q": 1.0})
        (step,) = next(client.sample("q", timeout=10))
        assert step.data[0].tolist() == [0, 1, 2], step
        info = client.server_info(timeout=10)["q"]
        assert info.signature is None and info.current_size == 0
        assert "tensorflow" not in sys.modules
        server.stop()
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
