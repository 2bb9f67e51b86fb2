"""Checkpoint messages, at the reference's import path."""
