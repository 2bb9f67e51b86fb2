"""Platform modules at the reference's import paths (`reverb.platform.checkpointers_lib`,
`reverb.platform.default.checkpointers`), for code written against Reverb 0.14."""
