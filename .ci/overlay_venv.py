"""A venv over the packages of the Python that runs this script: .ci/run's transformers-5.17 and TRL venvs.

`python3 -m venv --system-site-packages DIR` gives DIR the *base* interpreter's packages. Inside an activated venv
those are not the packages CI installed (torch, requirements.txt), and the tests run in DIR stop on `No module
named 'torch'`. This makes DIR as a plain venv, then writes a .pth file into its site-packages that adds every
site-packages folder of the Python running it (their own .pth files read too), after DIR's own: what DIR installs
wins (transformers 5.17 over requirements.txt's), the rest comes from the Python that runs CI, in a venv or not.

    python3 .ci/overlay_venv.py DIR [venv options, e.g. --without-pip]   # tests/test_ci.py checks it
"""
import os
import site
import subprocess
import sys


def main(folder: str, *venv_options: str) -> None:
    subprocess.run([sys.executable, "-m", "venv", *venv_options, folder], check=True)
    ask = "import sysconfig; print(sysconfig.get_path('purelib'))"
    own = subprocess.run([os.path.join(folder, "bin", "python"), "-c", ask], check=True,
                         capture_output=True, text=True).stdout.strip()
    with open(os.path.join(own, "overlay_of_ci_python.pth"), "w") as f:
        f.writelines(f"import site; site.addsitedir({path!r})\n" for path in site.getsitepackages())


if __name__ == "__main__":
    main(*sys.argv[1:])
