"""Loads the TensorFlow kernel library (`reverb/_tf_kernels*.so`, built only against TF's
stable C API, so one build serves every supported TensorFlow). Imports TensorFlow."""

from __future__ import annotations

import glob
import os
import threading
from typing import Any, Optional

_lock = threading.Lock()
_module: Optional[Any] = None


def library_path() -> str:
    """Path of the kernel library (`REVERB_TF_KERNELS` overrides it)."""
    override = os.environ.get("REVERB_TF_KERNELS")
    if override:
        return override
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_tf_kernels*.so")))
    if not found:
        raise ImportError(
            f"Reverb's TensorFlow kernels (_tf_kernels*.so) are missing from {here}: "
            "reinstall the package (pip install '.[tensorflow]' from its source)"
        )
    return found[0]


def ops() -> Any:
    """The generated op wrappers of the kernel library (loaded once per process)."""
    global _module
    with _lock:
        if _module is None:
            import tensorflow as tf

            _module = tf.load_op_library(library_path())
        return _module
