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


def keep_out_of_autograph() -> None:
    """Tells TensorFlow's autograph not to convert this package's functions. Users build
    datasets inside `tf.data` functions (Acme's `make_reverb_dataset` in an interleave), which
    autograph converts along with everything they call: our dataset-building Python (plain
    Python that makes ops, no tensor-dependent control flow) took seconds to convert. The rule
    sits where TensorFlow keeps its own (numpy, keras, ... are not converted either); without
    it (a TensorFlow that moved it), functions are still converted, only slower."""
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:
        return
    rules = tuple(getattr(config, "CONVERSION_RULES", ()))
    if not any(str(r) == "DoNotConvert rule for reverb" for r in rules):
        config.CONVERSION_RULES = (config.DoNotConvert("reverb"),) + rules
