#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py): training, memory against the plan, bf16 against fp32, vLLM against HF and the
# GPU tests, each held to a bound, then a table; exit 0 only when no check failed. At most 8 minutes on one H200.
# Python packages the GPU image lacks (datasets, math-verify) come as wheels in .whl/: fetch them on a machine with
# a registry (`bash bench/gpu_check.sh --fetch-wheels`), then carry .whl with the command.
#
#   bash bench/gpu_check.sh              # on the GPU machine
#   bash bench/gpu_check.sh --small      # CPU rehearsal: tiny-qwen3, small sizes (the GPU-only checks skip)
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch-wheels" ]; then  # Python 3.12 x86-64 wheels for the GPU image
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        datasets==5.2.0 dill==0.4.0 multiprocess==0.70.18 math-verify==0.9.0 latex2sympy2_extended==1.11.0 \
        antlr4-python3-runtime==4.13.2
    exit $?
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
timeout 480 python3 bench/gpu_check.py "$@"
status=$?
[ $status -eq 124 ] && echo "error: the GPU check ran past 8 minutes" >&2
exit $status
