#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py) in two parts that each fit one command of a lease (5 and 7 minutes; a lease
# is 15 minutes of device time, the machine's start included), checks in order of value, each with its own time
# bound: part 1 training (IP, rollout and update tokens/s, reserved against allocated) and bf16's importance
# ratio; part 2 the decode modes, then the cost at the 1.7B and 4B shapes (bench/gpu_cost.py), then memory against
# the plan, eval at a cell's prompt lengths, the GPU tests, SP training, the 0.6B cost and vLLM as time allows. Exit 0 only
# when no check failed. What comes back is $OUT/gpu_check.log (this output) and $OUT/gpu_check.json (the summary,
# rewritten after every check: a kill leaves the finished ones): 2 small files; the runs stay under
# /tmp/gpu_check/work. Python packages the GPU image lacks come as wheels in .whl/ (Python 3.12, x86-64): fetch them
# where a registry is reachable (`--fetch-wheels`), check them on the CPU machine (`python3 bench/gpu_check.py
# --preflight`), then carry .whl with the command.
#
#   bash bench/gpu_check.sh 1                # on the GPU machine: part 1 (OUT set by it; else /tmp/gpu_check)
#   bash bench/gpu_check.sh 2                # part 2 (7 minutes), on the same machine (eval reads part 1's run)
#   bash bench/gpu_check.sh --only memory    # one check again
#   bash bench/gpu_check.sh --small          # CPU rehearsal of every check: tiny-qwen3, small sizes
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--fetch-wheels" ]; then  # what gpu_check.py imports beyond torch, transformers, peft, accelerate
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 xxhash==4.1.0 pandas==3.1.1 python-dateutil==2.9.0.post0 \
        six==1.17.0 math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 \
        pytest==9.0.3 pluggy==1.6.0 iniconfig==2.3.0 pygments==2.20.0
    exit $?
fi
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
export OUT HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
case " $* " in
    *" --small "*) limit=480 ;;                       # every check on the CPU
    *" 1 "*|*" --only "*) limit=300 ;;               # part 1, or named checks
    *" 2 "*) limit=420 ;;                             # part 2: the decode and both costs, then what fits
    *) limit=600 ;;                                   # both parts in one command
esac
timeout "$limit" python3 bench/gpu_check.py "$@" 2>&1 | tee "$OUT/gpu_check.log"
status=${PIPESTATUS[0]}
[ "$status" -eq 124 ] && echo "error: the GPU check ran past $limit s (gpu_check.json holds the finished checks)" \
    | tee -a "$OUT/gpu_check.log" >&2
exit "$status"
