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


# Our modules autograph need not convert: plain Python that makes ops, with no control flow on
# tensors and no user functions called. (`reverb.pattern_dataset` is not among them: it calls
# the user's `is_end_of_episode`, which autograph must convert, as the reference's does.)
_PLAIN_MODULES = (
    "reverb._dataset",
    "reverb._dtypes",
    "reverb._nest",
    "reverb._signature",
    "reverb._structure",
    "reverb._tf_ops",
    "reverb.client",
    "reverb.errors",
    "reverb.replay_sample",
    "reverb.tf_client",
    "reverb.timestep_dataset",
    "reverb.trajectory_dataset",
    "reverb.trajectory_iterator",
)


def keep_out_of_autograph() -> None:
    """Tells TensorFlow's autograph not to convert our dataset and `TFClient` code. Users
    build datasets inside `tf.data` functions (Acme's `make_reverb_dataset` in an interleave),
    which autograph converts along with everything they call: converting ours more than
    doubled the construction time. The rules sit where TensorFlow keeps its own (numpy,
    keras, ... are not converted either); without them (a TensorFlow that moved them),
    functions are still converted, only slower."""
    try:
        from tensorflow.python.autograph.core import config
    except ImportError:
        return
    rules = tuple(getattr(config, "CONVERSION_RULES", ()))
    known = {str(r) for r in rules}
    ours = tuple(
        config.DoNotConvert(m) for m in _PLAIN_MODULES if f"DoNotConvert rule for {m}" not in known
    )
    if ours:
        config.CONVERSION_RULES = ours + rules
