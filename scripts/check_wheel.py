#!/usr/bin/env python3
"""Checks the wheel as a user on a fresh machine meets it: installs it into new virtualenvs
whose PATH has no cargo or rustc, and runs it from outside this checkout.

    python3 scripts/check_wheel.py dist/dm_reverb-*.whl
    python3 scripts/check_wheel.py --rustless-path STUBS   # the PATH it uses, for scripts/test

- With this interpreter: `pip install <wheel>[tensorflow]` into a new virtualenv, then
  `examples/demo.py` (the README's demo: an actor process, a learner through a dataset).
- With the oldest and the newest other CPython found (python3.9 ... python3.13, on PATH or
  pyenv's; with `--all-pythons` every one of them; none is needed): the wheel alone (numpy,
  protobuf), then a server, a trajectory writer and a sample."""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
OTHER_PYTHONS = ["python3.9", "python3.10", "python3.11", "python3.12", "python3.13"]
SMOKE = """
import numpy as np, reverb, sys
server = reverb.Server([reverb.Table.queue("q", 100)])
client = server.localhost_client()
with client.trajectory_writer(num_keep_alive_refs=2) as w:
    for t in range(5):
        w.append({"obs": np.full([3], t, np.float32)})
        if t >= 1:
            w.create_item("q", 1.0, {"obs": w.history["obs"][-2:]})
    w.flush(timeout_ms=10_000)
samples = client.sample("q", num_samples=4, emit_timesteps=False, timeout=10)
got = [s.data[0][:, 0].tolist() for s in samples]
assert got == [[0, 1], [1, 2], [2, 3], [3, 4]], got
assert "site-packages" in reverb.__file__, reverb.__file__
server.stop()
print(f"python {sys.version.split()[0]}: ok ({reverb.__file__})")
"""


#: Directories that hold much besides a distribution's Rust: shadowed, not left out.
SYSTEM_DIRS = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}
RUST_TOOLS = ("cargo", "rustc")


def rustless_path(stubs: pathlib.Path) -> str:
    """This PATH as on a machine without Rust: directories holding cargo or rustc are left
    out, except system directories, where commands in `stubs` (put first) shadow them and
    fail."""
    kept, shadow = [], False
    for d in os.environ["PATH"].split(os.pathsep):
        has_rust = d and any(os.path.exists(os.path.join(d, t)) for t in RUST_TOOLS)
        if not d or (has_rust and d not in SYSTEM_DIRS):
            continue
        shadow = shadow or bool(has_rust)
        kept.append(d)
    if shadow:
        stubs.mkdir(parents=True, exist_ok=True)
        for tool in RUST_TOOLS:
            stub = stubs / tool
            message = f"{tool}: not on this machine (no Rust)"
            stub.write_text(f'#!/bin/sh\necho "{message}" >&2\nexit 127\n')
            stub.chmod(0o755)
        kept.insert(0, str(stubs))
    return os.pathsep.join(kept)


def clean_env(venv: pathlib.Path) -> dict[str, str]:
    """The environment of a user without Rust: the venv first, then `rustless_path`."""
    stubs = venv.parent / "no-rust"
    path = os.pathsep.join([str(venv / "bin"), rustless_path(stubs)])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO", "RUST"))}
    env.update(PATH=path, TF_CPP_MIN_LOG_LEVEL="2", PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    for tool in RUST_TOOLS:
        found = shutil.which(tool, path=path)
        if found and pathlib.Path(found).parent != stubs:
            raise SystemExit(f"{tool} is on the clean PATH ({found}): the check would not hold")
    return env


def install(python: str, venv: pathlib.Path, requirement: str) -> dict[str, str]:
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    env = clean_env(venv)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--disable-pip-version-check", requirement], check=True, env=env)
    return env


def find_python(name: str) -> str | None:
    """An interpreter called `name` that runs: on PATH, or one of pyenv's."""
    candidates = [shutil.which(name)]
    candidates += sorted(str(p) for p in pathlib.Path.home().glob(f".pyenv/versions/*/bin/{name}"))
    for python in filter(None, candidates):
        if subprocess.run([python, "-c", ""], capture_output=True).returncode == 0:
            return python
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=pathlib.Path, nargs="?")
    parser.add_argument(
        "--rustless-path",
        type=pathlib.Path,
        metavar="STUBS",
        help="only print PATH without cargo and rustc (shadowing stubs go to STUBS)",
    )
    parser.add_argument(
        "--all-pythons",
        action="store_true",
        help="smoke-test every other CPython found, not only the oldest and the newest",
    )
    args = parser.parse_args()
    if args.rustless_path is not None:
        print(rustless_path(args.rustless_path))
        return
    if args.wheel is None:
        parser.error("the wheel to check is missing")
    wheel = args.wheel.resolve()
    with tempfile.TemporaryDirectory(prefix="reverb-wheel-") as tmp:
        work = pathlib.Path(tmp)
        print(f"== {sys.executable}: {wheel.name}[tensorflow] into a new virtualenv", flush=True)
        env = install(sys.executable, work / "tf", f"{wheel}[tensorflow]")
        demo = ROOT / "examples" / "demo.py"
        run = subprocess.run(
            [str(work / "tf/bin/python"), str(demo)], cwd=work, env=env, timeout=600
        )
        if run.returncode != 0:
            raise SystemExit(f"examples/demo.py failed with the installed wheel ({run.returncode})")
        me = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        found = {name: find_python(name) for name in OTHER_PYTHONS if name != me}
        others = [name for name, python in found.items() if python is not None]
        if not args.all_pythons:
            others = others[:1] + others[1:][-1:]
        for name in OTHER_PYTHONS:
            python = found.get(name)
            if name == me:
                print(f"== {name}: done above")
                continue
            if python is None:
                print(f"== {name}: not on this machine")
                continue
            if name not in others:
                print(f"== {name}: skipped (--all-pythons checks it)")
                continue
            print(f"== {name}: {wheel.name} into a new virtualenv", flush=True)
            venv = work / name
            env = install(python, venv, str(wheel))
            smoke = [str(venv / "bin/python"), "-c", SMOKE]
            subprocess.run(smoke, cwd=work, env=env, check=True, timeout=300)


if __name__ == "__main__":
    main()
