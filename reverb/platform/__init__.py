"""Platform modules at the reference's import paths (`reverb.platform.checkpointers_lib`,
`reverb.platform.default.checkpointers`), for code written against Reverb 0.14: loaded with
`reverb`, as the reference's are, so `reverb.platform.checkpointers_lib.DefaultCheckpointer`
works after a plain `import reverb`."""

from reverb.platform import checkpointers_lib, default

__all__ = ["checkpointers_lib", "default"]
