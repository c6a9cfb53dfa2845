"""Single-agent GRPO: one training step of ours (train.py's `train_step`) against TRL's GRPOTrainer.

Both sides get the same model (same seed), the same prompts (the single-agent
prompt of synthetic math, chat template applied by each side), the same group
size, max completion length, LoRA settings (all linear layers), sampling
temperature, loss aggregation (seq-mean-token-mean = TRL's `loss_type="grpo"`),
clip range, rows per forward pass and reward (tasks.grade). One step is
rollout + reward + advantages + one optimizer step on both sides. TRL's
gradient checkpointing and bf16 autocast (both on by default in GRPOConfig)
are turned off: we train in fp32 without checkpointing, so both sides compute
the same thing (on a CPU without bf16 matmul kernels, TRL's defaults are many
times slower still).

The two alternate step by step in one process: a TRL callback runs one of our
steps after each TRL step, so machine noise hits both alike. We print the
median step time of each after `--warmup` steps and the ratio ours / TRL
(below 1 = ours faster).

By default every completion is forced to `--new-tokens` tokens (`min_new_tokens`
on both sides), so both do exactly the same number of tokens of work;
`--free-length` lets completions stop at EOS (then the work differs by chance).

    pip install trl==1.16.0                                  # bench only: not in requirements.txt
    python bench/bench_trl.py                                # tiny random model (a minute)
    python bench/bench_trl.py --model smollm2 --steps 3      # SmolLM2-135M (about 10 minutes on 2 cores)
    python bench/bench_trl.py --model smollm2 --steps 3 --skip-zero-advantage   # ours skips zero-advantage calls
    python bench/bench_trl.py --no-share-prompts             # ours runs every row's prompt, as TRL does
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import train  # noqa: E402
from policies import load_model  # noqa: E402
from tasks import grade, math_splits  # noqa: E402
from workflows import WorkflowOptions, solver_messages  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny | smollm2")
    p.add_argument("--tasks", type=int, default=8, help="prompts per step")
    p.add_argument("--n", type=int, default=4, help="completions per prompt (group size)")
    p.add_argument("--new-tokens", type=int, default=32, help="max completion tokens")
    p.add_argument("--free-length", action="store_true", help="let completions stop at EOS (default: forced length)")
    p.add_argument("--steps", type=int, default=4, help="measured steps per side")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps per side first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-zero-advantage", action="store_true", help="ours with --skip-zero-advantage (same step, "
                   "no forward/backward for zero-advantage calls; TRL has no such option)")
    p.add_argument("--no-share-prompts", action="store_true", help="ours with --no-share-prompts (one pass per row "
                   "over its whole prompt, as TRL does; default: each distinct prompt runs once per batch)")
    args = p.parse_args()
    try:
        from peft import LoraConfig
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        raise SystemExit("error: this benchmark needs TRL: pip install trl==1.16.0") from None
    from datasets import Dataset
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    rows = args.tasks * args.n
    total_steps = args.warmup + args.steps

    # ---- ours: exactly what `python train.py` runs, flags spelled as a user would
    flags = ["--model", args.model, "--workflow", "single", "--policy", "sp", "--tasks-per-step", str(args.tasks),
             "--group-size", str(args.n), "--max-new-tokens", str(args.new_tokens), "--lora-rank", "16",
             "--lora-alpha", "32",
             "--agg", "seq-mean-token-mean", "--micro-batch-size", str(rows), "--gen-batch-size", str(rows),
             "--lr", "5e-4", "--warmup-steps", "0", "--difficulty", "0", "--val-every", "0"]
    flags += ["--skip-zero-advantage"] if args.skip_zero_advantage else []
    flags += ["--no-share-prompts"] if args.no_share_prompts else []
    ours_args = train.settings_from_flags(train.flags.parse_args(train.build_parser(), flags, train.ROLES))
    train.checkpoints.seed_everything(0)
    trainer = train.build_trainer(ours_args, "cpu")
    if not args.free_length:
        trainer.model.generation_config.min_new_tokens = args.new_tokens
    tasks, _ = math_splits(170, 64, difficulty=0, seed=0)
    batches = [tasks[i * args.tasks:(i + 1) * args.tasks] for i in range(total_steps)]
    ours_times: list[float] = []

    def ours_step() -> None:
        t = time.perf_counter()
        train.train_step(batches[len(ours_times)], ours_args, trainer)
        ours_times.append(time.perf_counter() - t)

    # ---- TRL: the same prompts, reward, model init and settings
    by_question = {t.question: t for t in tasks}
    prompt_rows = [{"prompt": solver_messages(t, WorkflowOptions()), "question": t.question}
                   for b in batches for t in b]

    def math_reward(completions, question, **_):
        return [grade(by_question[q], c[0]["content"]).reward for c, q in zip(completions, question)]

    train.checkpoints.seed_everything(0)
    trl_model, _ = load_model(args.model)
    trl_times: list[float] = []

    class Alternate(TrainerCallback):
        """Time each TRL step, then run one of ours, so the two sides alternate."""

        def on_step_begin(self, *_, **__):
            self.t = time.perf_counter()

        def on_step_end(self, *_, **__):
            trl_times.append(time.perf_counter() - self.t)
            ours_step()
            print(f"step {len(trl_times)}/{total_steps}: TRL {trl_times[-1]:.1f} s, ours {ours_times[-1]:.1f} s",
                  flush=True)

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, use_cpu=True, report_to="none", save_strategy="no", logging_strategy="no",
            disable_tqdm=True,
            max_steps=total_steps, per_device_train_batch_size=rows, gradient_accumulation_steps=1,
            num_generations=args.n, max_completion_length=args.new_tokens, temperature=ours_args.update.temperature,
            top_p=ours_args.top_p, top_k=0, loss_type="grpo", epsilon=0.2, epsilon_high=0.28, beta=0.0,
            learning_rate=5e-4, warmup_steps=0, max_grad_norm=ours_args.update.max_grad_norm, shuffle_dataset=False,
            gradient_checkpointing=False, bf16=False,  # TRL's defaults are on; we train in fp32, no checkpointing
            generation_kwargs=None if args.free_length else {"min_new_tokens": args.new_tokens}, seed=0)
        trl_trainer = GRPOTrainer(model=trl_model, reward_funcs=math_reward, args=config,
                                  processing_class=trainer.tokenizer, train_dataset=Dataset.from_list(prompt_rows),
                                  callbacks=[Alternate()],
                                  peft_config=LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                         target_modules="all-linear", task_type="CAUSAL_LM"))
        trl_trainer.train()

    ours_med = statistics.median(ours_times[args.warmup:])
    trl_med = statistics.median(trl_times[args.warmup:])
    print(f"model {args.model}: {args.tasks} prompts x {args.n} completions x {args.new_tokens} new tokens"
          f" ({'free' if args.free_length else 'forced'} length), {args.steps} steps after {args.warmup} warm-up")
    print(f"single-agent step  ours {ours_med:7.2f} s   TRL GRPOTrainer {trl_med:7.2f} s   ratio ours/TRL "
          f"{ours_med / trl_med:.3f}")


if __name__ == "__main__":
    main()
