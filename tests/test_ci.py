""".ci/run's venvs over this Python's packages (the transformers-5.17 and the TRL one): they see the packages of
the Python that runs CI, a bare interpreter's or an activated venv's, and their own first.

    python -m pytest -q tests/test_ci.py
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def overlay_lines() -> dict[str, list[str]]:
    """The lines of .ci/run that make each overlay venv: they name its folder, "$TF517" or "$TRL", and are neither
    its assignment nor a command run in it."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        lines = [line.strip() for line in f]
    return {v: [x for x in lines if f'"${v}"' in x and not x.startswith(f"{v}=") and f"${v}/bin" not in x]
            for v in ("TF517", "TRL")}


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, **kwargs)


def test_the_overlay_venvs_see_the_packages_of_the_python_that_runs_ci(tmp_path):
    """Inside an activated venv A (made --without-pip, a marker module in its site-packages), the line of .ci/run
    that makes the transformers-5.17 venv makes one that imports the marker, A's site-packages after its own; on a
    bare interpreter, one that imports this interpreter's packages (pytest). The TRL venv is made by the same
    line. The old line, `python3 -m venv --system-site-packages`, gave a venv the base interpreter's packages, not
    A's, and .ci/run failed on `No module named 'torch'` inside a venv. (--without-pip on both: no pip install.)"""
    lines = overlay_lines()
    assert len(lines["TF517"]) == 1 and lines["TRL"] == [x.replace("TF517", "TRL") for x in lines["TF517"]], lines
    make = lines["TF517"][0] + " --without-pip"
    a = tmp_path / "a"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(a)]).returncode == 0
    where = "import sys, sysconfig; print(sysconfig.get_path('purelib')); print(*sys.path, sep='\\n')"
    a_lib = run([str(a / "bin" / "python"), "-c", where]).stdout.split("\n")[0]
    with open(os.path.join(a_lib, "marl_ci_marker.py"), "w") as f:
        f.write("WHERE = 'venv A'\n")
    activated = {**os.environ, "PATH": f"{a / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(a),
                 "TF517": str(tmp_path / "inside")}
    made = run(["bash", "-c", make], cwd=ROOT, env=activated)
    assert made.returncode == 0, made.stderr
    seen = run([str(tmp_path / "inside" / "bin" / "python"), "-c",
                "import marl_ci_marker; print(marl_ci_marker.WHERE)\n" + where])
    assert seen.returncode == 0, seen.stderr
    marker, own, *path = seen.stdout.strip().split("\n")
    assert marker == "venv A" and path.index(own) < path.index(a_lib)  # what it installs wins
    bare = tmp_path / "bare-bin"  # `python3` is the interpreter running this test, no venv active
    bare.mkdir()
    os.symlink(sys.executable, bare / "python3")
    plain = {**os.environ, "PATH": f"{bare}{os.pathsep}{os.environ['PATH']}", "TF517": str(tmp_path / "outside")}
    plain.pop("VIRTUAL_ENV", None)
    assert run(["bash", "-c", make], cwd=ROOT, env=plain).returncode == 0
    assert run([str(tmp_path / "outside" / "bin" / "python"), "-c", "import pytest"]).returncode == 0
