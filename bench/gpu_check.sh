#!/usr/bin/env bash
# The prepared GPU check: what one lent H200 measures in at most 8 minutes, as one command
# (bench/README.md, "Memory, and the plan for one GPU").
#   1. vLLM against HF generation in tokens/s, two LoRA adapters (bench/bench_vllm.py); skipped, and said so,
#      where vLLM does not import (the lent machine's image has no vLLM, and its wheels are over what a call carries);
#   2. three training steps of a Voting-IP cell configuration (--cell Voting-IP-0.6B-Math, 8 tasks x 8 samples,
#      512-token responses): step time, peak GPU memory of the trainer, vllm/logprob_drift when vLLM ran.
# Nothing is downloaded: Qwen/Qwen3-0.6B is used when it is in the local hub cache, else `random-qwen3-0.6b` (the
# same shape, random weights, built in code). The data is a DAPO-format file of synthetic problems written here.
# Python packages the GPU image lacks (datasets, math-verify) come as wheels in .whl/: fetch them on a machine with
# a registry (`bash bench/gpu_check.sh --fetch-wheels`), then carry .whl with the command.
#
#   bash bench/gpu_check.sh              # on the GPU machine
#   bash bench/gpu_check.sh --small      # CPU rehearsal: tiny-qwen3, a few tokens, under 3 minutes
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-gpu}
if [ "$MODE" = "--fetch-wheels" ]; then  # Python 3.12 x86-64 wheels for the GPU image (KINDS.md lists what it has)
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
OUT_DIR=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT_DIR"
python3 -c "import torch; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(),
torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"

if [ "$MODE" = "--small" ]; then
    MODEL=tiny-qwen3; SIZE=(--tasks-per-step 2 --n 2 --max-new-tokens 16); BENCH=(--small)
else
    MODEL=Qwen/Qwen3-0.6B; SIZE=(--tasks-per-step 8 --max-new-tokens 512 --gen-batch-size 256); BENCH=()
    python3 -c "from huggingface_hub import try_to_load_from_cache as f
import sys; sys.exit(0 if isinstance(f('Qwen/Qwen3-0.6B', 'config.json'), str) else 1)" 2>/dev/null \
        || { MODEL=random-qwen3-0.6b; echo "Qwen/Qwen3-0.6B is not in the hub cache: using $MODEL"; }
fi

echo "== 1. vLLM vs HF generation, two LoRA adapters"
if python3 -c "import vllm" 2>/dev/null; then
    timeout 240 python3 bench/bench_vllm.py "${BENCH[@]}" 2>&1 | grep -v -i warn | tail -5
else
    echo "vLLM does not import here: skipped (the HF engine is measured in part 2)"
fi

echo "== 2. three training steps: --cell Voting-IP-0.6B-Math --model $MODEL ${SIZE[*]}"
python3 -c "import json, tasks
rows = [{'prompt': t.question, 'solution': t.answer} for t in tasks.synthetic_math(200, difficulty=1, seed=1)]
open('$OUT_DIR/dapo.jsonl', 'w').write(''.join(json.dumps(r) + '\n' for r in rows))"
rm -rf "$OUT_DIR/run"
timeout 300 python3 train.py --cell Voting-IP-0.6B-Math --model "$MODEL" --data "$OUT_DIR/dapo.jsonl" --steps 3 \
    --val-every 0 --run-dir "$OUT_DIR/run" "${SIZE[@]}" 2>&1 | grep -v -i -E "warn|it/s\]" | tail -8
python3 - "$OUT_DIR/run" <<'EOF'
import json, sys
lines = [json.loads(x) for x in open(f"{sys.argv[1]}/metrics.jsonl")]
for m in lines:
    print(f"step {m['step']}: rollout {m['time_rollout']:.1f} s, update {m['time_update']:.1f} s, "
          f"{m['rollout_tok_s']:.0f} generated tok/s, {m['update_tok_s']:.0f} trained tok/s, peak trainer memory "
          f"{m.get('memory/peak_gib', float('nan')):.1f} GiB, GPU in use {m.get('memory/device_used_gib', float('nan')):.1f}"
          f" GiB, vllm/logprob_drift {m.get('vllm/logprob_drift')}")
EOF
