"""`import reverb` and the whole non-TF API work when TensorFlow cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_reverb_works_without_tensorflow() -> None:
    script = textwrap.dedent(
        """
        import sys

        class BlockTensorFlow:
            def find_spec(self, name, path=None, target=None):
                if name == "tensorflow" or name.startswith("tensorflow."):
                    raise ImportError("tensorflow is blocked for this test")
                return None

        sys.meta_path.insert(0, BlockTensorFlow())

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
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
