"""The lent GPU machine's Python packages: the wheels of .whl/ installed the way that machine installs them, and
the versions and unmet requirements the GPU check's header reports (bench/gpu_check.py uses both).

What it is for: the lent machine has torch, transformers, peft and accelerate but no network; what else the GPU
check imports (datasets and its pure-Python dependencies, math-verify, pytest ...) comes as wheels for its Python
(DEVICE_PYTHON), fetched by `bash bench/gpu_check.sh --fetch-wheels`. On that machine the wheels whose package it
lacks go into SITE (never over a package it has); `--preflight` on this CPU machine installs all of them for
DEVICE_PYTHON into a fresh folder (so a missing or wrongly tagged wheel fails here), then imports every module the
checks import with the pure-Python wheels first on the path (binary wheels for another Python cannot load here:
those come from this machine's own install, and only their install is checked). What it cannot check: whether the
image's own pyarrow and huggingface_hub meet datasets' requirements (the header's `unmet requirements` line says
so on the device, in its first seconds).

    python3 bench/gpu_check.py --preflight
"""
from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE_PYTHON = "3.12"  # the lent machine's Python (assumed, as bench/gpu_check.sh --fetch-wheels fetches for it)
SITE = "/tmp/gpu-check-site"  # where .whl/ is installed on the lent machine
PIP_TARGET = ["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--target"]
VERSIONS = ["torch", "transformers", "peft", "datasets", "accelerate", "math-verify", "pyarrow", "huggingface-hub",
            "pandas", "numpy", "pytest"]
CHECK_IMPORTS = "import train, eval, grpo, policies, tasks, workflows, infra.memory, datasets, math_verify, pytest"


def wheel_name(path: str) -> str:
    """The distribution a wheel file installs: `math_verify-0.9.0-py3-none-any.whl` -> `math_verify`."""
    return os.path.basename(path).split("-")[0]


def install_wheels(wheel_dir: str, target: str, every: bool, python: str | None = None) -> list[str]:
    """pip-install the wheels of `wheel_dir` into `target` without the index or dependencies (the lent machine's
    way): every one (`every`), or those whose package this Python lacks. `python` (e.g. 3.12) installs for that
    Python's tags instead of this one's. Returns the distributions installed."""
    wheels = sorted(glob.glob(os.path.join(wheel_dir, "*.whl")))
    if not every:
        wheels = [w for w in wheels if not installed(wheel_name(w))]
    tags = ["--python-version", python, "--implementation", "cp", "--only-binary=:all:", "--platform",
            "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"] \
        if python else []
    if wheels:
        subprocess.run([sys.executable, *PIP_TARGET, target, *tags, *wheels], check=True)
    return [wheel_name(w) for w in wheels]


def installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def versions(site: str | None) -> dict:
    """The versions of VERSIONS (None: not installed), which of them come from `site`, and each requirement of a
    distribution in `site` that this environment does not meet (markers as on this Python)."""
    from packaging.requirements import Requirement
    out = {name: (importlib.metadata.version(name) if installed(name) else None) for name in VERSIONS}
    overlay = list(importlib.metadata.distributions(path=[site])) if site and os.path.isdir(site) else []
    unmet = []
    for dist in overlay:
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            have = importlib.metadata.version(req.name) if installed(req.name) else None
            if have is None or not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{dist.metadata['Name']} needs {req} (found {have})")
    return {"python": sys.version.split()[0], **out, "from .whl": sorted(d.metadata["Name"] for d in overlay),
            "unmet requirements": unmet}


def preflight(wheel_dir: str) -> int:
    """On this CPU machine: the lent machine's install of .whl/ (for Python DEVICE_PYTHON) into a fresh folder;
    then the pure-Python wheels into another, imported from there (binary ones cannot load on another Python),
    with every module the checks import; versions and unmet requirements printed."""
    if not glob.glob(os.path.join(wheel_dir, "*.whl")):
        print(f"error: no wheels in {wheel_dir}: bash bench/gpu_check.sh --fetch-wheels", file=sys.stderr)
        return 1
    fresh = tempfile.mkdtemp(prefix="gpu-check-preflight-")
    names = install_wheels(wheel_dir, os.path.join(fresh, "device"), every=True, python=DEVICE_PYTHON)
    print(f"preflight: {len(names)} wheels install for Python {DEVICE_PYTHON} into {fresh}/device: {', '.join(names)}")
    pure = os.path.join(fresh, "pure")
    pure_wheels = [w for w in glob.glob(os.path.join(wheel_dir, "*.whl"))
                   if os.path.basename(w).split("-")[-3] in ("py3", "py2.py3")]  # not multiprocess' py312 build
    subprocess.run([sys.executable, *PIP_TARGET, pure, *pure_wheels], check=True)
    script = (f"import sys, json; sys.path.insert(0, {pure!r}); sys.path.insert(1, {ROOT!r}); {CHECK_IMPORTS}; "
              "sys.path.insert(0, 'bench'); import gpu_wheels; "
              f"print(json.dumps({{**gpu_wheels.versions({pure!r}), 'loaded from': {{m: sys.modules[m].__file__ "
              "for m in ('datasets', 'dill', 'math_verify', 'pytest', 'pandas', 'xxhash', 'multiprocess') "
              "if m in sys.modules}}))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"preflight: FAIL importing the checks' modules: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        return 1
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"preflight: the checks' modules import ({len(pure_wheels)} pure-Python wheels from {pure}):")
    for key, value in report.items():
        print(f"  {key}: {value}")
    return 0
