"""The default platform's modules (`reverb.platform.default.checkpointers`)."""

from reverb.platform.default import checkpointers

__all__ = ["checkpointers"]
