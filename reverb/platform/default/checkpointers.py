"""The default platform's checkpointers (`reverb.platform.default.checkpointers`, which the
reference exports as `reverb.checkpointers`): the same classes as `reverb.checkpointers`."""

from reverb.platform import checkpointers_lib  # noqa: F401
from reverb.platform.checkpointers_lib import (  # noqa: F401
    CheckpointerBase,
    DefaultCheckpointer,
    TempDirCheckpointer,
    default_checkpointer,
)
