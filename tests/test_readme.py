"""The README's quick start runs as written."""

from __future__ import annotations

import pathlib
import re

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_quick_start_runs() -> None:
    text = README.read_text()
    match = re.search(r"## Quick start\n\n```python\n(.*?)```", text, re.S)
    assert match, "README has no quick start block"
    namespace: dict = {}
    exec(compile(match.group(1), "README quick start", "exec"), namespace)  # noqa: S102
    client = namespace["client"]
    # The quick start ends with the writer's items stored and the server stopped.
    assert namespace["writer"].episode_steps == 0
    assert client.server_address.startswith("localhost:")
