"""The default platform's checkpointers (`reverb.platform.default.checkpointers`, which the
reference exports as `reverb.checkpointers`): the same classes as `reverb.checkpointers`."""

from reverb.checkpointers import (  # noqa: F401
    CheckpointerBase,
    DefaultCheckpointer,
    TempDirCheckpointer,
    default_checkpointer,
)
