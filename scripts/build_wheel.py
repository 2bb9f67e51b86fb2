#!/usr/bin/env python3
"""Builds the wheel users install: one file for every CPython >= 3.9 on Linux x86-64.

    python3 scripts/build_wheel.py [--out dist] [--sdist]

The two native libraries (`reverb._native`, built for Python's stable ABI, abi3, and the
TensorFlow kernels, built on TF's stable C API) are compiled once in release mode and linked
by zig against glibc 2.17 (`cargo zigbuild`), so the wheel carries the manylinux2014 tag.
zig, cargo-zigbuild, auditwheel and abi3audit come from PyPI, pinned, into a tools
virtualenv (`$REVERB_BUILD_VENV`, by default ~/.cache/reverb-build-venv). The libraries are
stripped; the Python sources, typing stubs and metadata come from this checkout and
pyproject.toml. The wheel is then checked: `auditwheel show` must find glibc 2.17 symbols
only and no library outside the manylinux policy but TensorFlow's own, and `abi3audit
--strict` no violation of the stable ABI.

Needs cargo (rustup's stable toolchain), Python >= 3.11 (tomllib), git, `strip` (binutils)
and PyPI (the tools) to run; the wheel needs none of them."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOOLS = [
    "ziglang==0.17.1",
    "cargo-zigbuild==0.24.0",
    "auditwheel==6.8.2",
    "abi3audit==0.0.26",
    "build==1.3.0",
]
#: The Rust target: x86-64 Linux, linked against glibc 2.17's symbols (zig's suffix).
TARGET = "x86_64-unknown-linux-gnu"
GLIBC = "2.17"
#: Python's stable ABI from 3.9 on (pyo3's `abi3-py39` in crates/reverb-python).
PYTHON_TAG, ABI_TAG = "cp39", "abi3"
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64"]
#: The one library the wheel needs from outside the manylinux policy: TensorFlow's framework
#: library, which only the kernels need, loaded by TensorFlow itself before them (as for any
#: TensorFlow custom-op wheel); auditwheel therefore reports the overall tag as linux_x86_64.
EXTERNAL = {"libtensorflow_framework.so.2"}
#: The native libraries: (cargo package, built file, name in the wheel).
LIBRARIES = [
    ("reverb-python", "lib_native.so", "reverb/_native.abi3.so"),
    ("reverb-tf-ops", "libreverb_tf_ops.so", "reverb/_tf_kernels.abi3.so"),
]


def tools_venv() -> pathlib.Path:
    """The virtualenv with the pinned build tools, made or updated when the pins changed."""
    venv = pathlib.Path(
        os.environ.get("REVERB_BUILD_VENV", pathlib.Path.home() / ".cache/reverb-build-venv")
    )
    stamp = venv / "reverb-tools.txt"
    wanted = "\n".join(TOOLS) + "\n"
    if not stamp.exists() or stamp.read_text() != wanted:
        print(f"== installing the build tools into {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin/python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "--disable-pip-version-check", *TOOLS], check=True)
        stamp.write_text(wanted)
    return venv


def build_libraries(venv: pathlib.Path) -> pathlib.Path:
    """Compiles both libraries (one cargo invocation); returns the directory holding them."""
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    packages = [arg for package, _, _ in LIBRARIES for arg in ("-p", package)]
    command = ["cargo", "zigbuild", "--release", "--target", f"{TARGET}.{GLIBC}", *packages]
    command += ["--features", "reverb-python/extension-module"]
    print("== " + " ".join(command), flush=True)
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    target_dir = os.environ.get("CARGO_TARGET_DIR", ROOT / "target")
    return pathlib.Path(target_dir) / TARGET / "release"


def stripped(library: pathlib.Path, into: pathlib.Path) -> pathlib.Path:
    """A copy of `library` without its symbol tables and debug sections."""
    into.mkdir(parents=True, exist_ok=True)
    out = into / library.name
    strip = shutil.which("strip")
    if strip is None:
        raise SystemExit("`strip` (binutils) is needed to strip the native libraries")
    subprocess.run([strip, "--strip-unneeded", "-o", str(out), str(library)], check=True)
    return out


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def version() -> str:
    """Cargo.toml's `[workspace.package] version` (setup.py reads the same)."""
    text = (ROOT / "Cargo.toml").read_text()
    section = text.partition("[workspace.package]")[2].split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', section, re.MULTILINE)
    if match is None:
        raise SystemExit("no version in Cargo.toml's [workspace.package]")
    return match.group(1)


def metadata(meta: dict, version: str) -> str:
    """The core metadata (METADATA) from pyproject.toml's [project]."""
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {meta['name']}",
        f"Version: {version}",
        f"Summary: {meta['description']}",
        f"License: {meta['license']['text']}",
        "License-File: LICENSE",
        f"Requires-Python: {meta['requires-python']}",
    ]
    lines += [f"Requires-Dist: {d}" for d in meta.get("dependencies", [])]
    for extra, requirements in meta.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        for requirement in requirements:
            name, _, marker = requirement.partition(";")
            marker = f"({marker.strip()}) and " if marker.strip() else ""
            lines.append(f'Requires-Dist: {name.strip()}; {marker}extra == "{extra}"')
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + (ROOT / meta["readme"]).read_text()


def sources() -> list[pathlib.Path]:
    """The package's Python sources and typing files that git tracks (no built libraries,
    caches or stray files)."""
    tracked = subprocess.run(
        ["git", "ls-files", "reverb"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    files = [ROOT / name for name in tracked]
    return [f for f in files if f.suffix in (".py", ".pyi") or f.name == "py.typed"]


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(out_dir: pathlib.Path, libraries: dict[str, pathlib.Path]) -> pathlib.Path:
    meta, ver = project(), version()
    dist = meta["name"].replace("-", "_")
    tag = f"{PYTHON_TAG}-{ABI_TAG}-{'.'.join(PLATFORMS)}"
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{dist}-{ver}-{tag}.whl"
    info = f"{dist}-{ver}.dist-info"
    entries: list[tuple[str, bytes, int]] = []  # (name in the wheel, bytes, mode)
    for path in sources():
        entries.append((path.relative_to(ROOT).as_posix(), path.read_bytes(), 0o644))
    for name, path in libraries.items():
        entries.append((name, path.read_bytes(), 0o755))
    wheel_file = "Wheel-Version: 1.0\nGenerator: reverb scripts/build_wheel.py\n"
    wheel_file += "Root-Is-Purelib: false\n"
    wheel_file += "".join(f"Tag: {PYTHON_TAG}-{ABI_TAG}-{p}\n" for p in PLATFORMS)
    scripts = meta.get("scripts", {})
    entry_points = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
    entries += [
        (f"{info}/METADATA", metadata(meta, ver).encode(), 0o644),
        (f"{info}/WHEEL", wheel_file.encode(), 0o644),
        (f"{info}/entry_points.txt", entry_points.encode(), 0o644),
        (f"{info}/LICENSE", (ROOT / "LICENSE").read_bytes(), 0o644),
        (f"{info}/top_level.txt", b"reverb\n", 0o644),
    ]
    record = [record_line(name, data) for name, data, _ in entries] + [f"{info}/RECORD,,"]
    entries.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for name, data, mode in entries:
            entry = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
    tmp.replace(wheel)
    return wheel


def check(venv: pathlib.Path, wheel: pathlib.Path) -> None:
    """auditwheel must find only glibc 2.17 symbols and no library outside the manylinux
    policy but TensorFlow's own (see EXTERNAL); abi3audit no violation of the stable ABI."""
    shown = subprocess.run(
        [str(venv / "bin/auditwheel"), "show", "--json", str(wheel)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    report = json.loads(shown)
    print(f"auditwheel: symbols {report['sym_tag']}, external {sorted(report['external_libs'])}")
    if report["sym_tag"] != PLATFORMS[0] or set(report["external_libs"]) - EXTERNAL:
        raise SystemExit(f"auditwheel: {wheel.name} is not {PLATFORMS[0]}:\n{shown}")
    audit = subprocess.run(
        [str(venv / "bin/abi3audit"), "--strict", "--report", str(wheel)],
        capture_output=True,
        text=True,
    )
    print(f"abi3audit: {audit.stdout.strip()[-2000:]}")
    if audit.returncode != 0:
        raise SystemExit(f"abi3audit found violations in {wheel.name}:\n{audit.stderr[-2000:]}")


def build_sdist(venv: pathlib.Path, out_dir: pathlib.Path) -> pathlib.Path:
    """The source distribution (setuptools through `python -m build`), checked to hold every
    file of the Rust workspace and the protocol that git tracks: it must build from source."""
    for old in out_dir.glob("*.tar.gz"):
        old.unlink()
    command = [str(venv / "bin/python"), "-m", "build", "--sdist", "--outdir", str(out_dir)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    [sdist] = out_dir.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        held = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    tracked = subprocess.run(
        ["git", "ls-files", "crates", "proto", "Cargo.toml", "Cargo.lock", "setup.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    missing = sorted(set(tracked) - held)
    if missing:
        raise SystemExit(f"{sdist.name} lacks {missing[:10]} ({len(missing)} files)")
    return sdist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "dist"), help="where the wheel goes")
    parser.add_argument("--sdist", action="store_true", help="also the source distribution")
    args = parser.parse_args()
    venv = tools_venv()
    built = build_libraries(venv)
    staging = pathlib.Path(args.out) / ".stripped"
    libraries = {name: stripped(built / file, staging) for _, file, name in LIBRARIES}
    for old in pathlib.Path(args.out).glob("*.whl"):
        old.unlink()
    wheel = write_wheel(pathlib.Path(args.out), libraries)
    shutil.rmtree(staging)
    check(venv, wheel)
    print(f"== {wheel} ({wheel.stat().st_size / 1e6:.1f} MB)")
    if args.sdist:
        sdist = build_sdist(venv, pathlib.Path(args.out))
        print(f"== {sdist} ({sdist.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
