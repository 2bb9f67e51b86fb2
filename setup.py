"""Build hook: the package version is Cargo.toml's `[workspace.package] version`, declared
there only (the extension reports the same one as `reverb._native.__version__`)."""

import pathlib
import re

from setuptools import setup


def cargo_version() -> str:
    text = (pathlib.Path(__file__).parent / "Cargo.toml").read_text()
    _, found, rest = text.partition("[workspace.package]")
    section = rest.split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', section, re.MULTILINE) if found else None
    if match is None:
        raise RuntimeError("no version in Cargo.toml's [workspace.package]")
    return match.group(1)


setup(version=cargo_version())
