"""The default platform's modules (`reverb.platform.default.checkpointers`)."""
