"""The checkpointer classes at the reference's path (`reverb.platform.checkpointers_lib`):
the same classes as `reverb.checkpointers`."""

from reverb.checkpointers import (  # noqa: F401
    CheckpointerBase,
    DefaultCheckpointer,
    TempDirCheckpointer,
    default_checkpointer,
)
