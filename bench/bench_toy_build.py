"""Where a toy model's build spends its time, what bounds it, and that its thread count changes no bit.

Runs the stages of a build of seed S as toyworld/toy_model.py runs them (the oracle's transcripts, the tokenizer,
the rows), then times the warm-up's two kinds of step (a habit batch of BATCH rows, a fact batch of FACT_BATCH) on
batches drawn as the warm-up draws them, and takes each step apart:
- tokens: the batch's prompt, completion and padding tokens (the loss is on completion tokens only);
- warm-up step: `batch_loss`, backward and AdamW, as the build runs it;
- Python: building the batch's tensors alone;
- LM head: the same step with the LM head and loss on completion positions only (a speed-up that changes the
  floating-point sums, so not the build's);
- bare: a forward and backward of the same padded rows and nothing else (no loss, no clipping, no AdamW): the
  floor of a step that runs these rows through this model; the warm-up step over it is how far the build is from
  that floor.
Then checks the claim the build rests on: `warm_up` from one initial model gives the same parameters, bit for bit,
on one thread and on two. Time it alone: another torch process on the 2 cores distorts every number.

    python bench/bench_toy_build.py --seed 0      # about 3 minutes
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import eval as ev  # noqa: E402 (the repository root, above)
from toyworld import toy, toy_model  # noqa: E402


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def step_time(model, loss_of, batches) -> float:
    """The median seconds of a forward, backward and AdamW step over `batches`."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for batch in batches:
        start = time.perf_counter()
        loss = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def head_on_completions_loss(model, batch):
    """The warm-up's loss with the LM head (and its softmax) on the completion positions only."""
    ids, labels = toy_model.padded(batch)
    hidden = model.model(input_ids=ids).last_hidden_state[:, :-1]
    where = labels[:, 1:] != -100
    logits = model.lm_head(hidden[where])
    return torch.nn.functional.cross_entropy(logits, labels[:, 1:][where], reduction="sum") / toy_model.TOKEN_NORM


def bare_time(model, batches) -> float:
    """The median seconds of a forward and backward of a batch's padded rows, nothing else."""
    times = []
    for batch in batches:
        ids, _ = toy_model.padded(batch)
        start = time.perf_counter()
        model(input_ids=ids).logits.sum().backward()
        times.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    return statistics.median(times)


def same_on_two_threads(model, rows, fact_rows, seed: int, steps: int) -> bool:
    """`warm_up` of `steps` steps from the same model on one thread and on two: the same parameters, bit for bit."""
    trained = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        copy_ = copy.deepcopy(model)
        toy_model.warm_up(copy_, rows, seed, steps, fact_rows, desc=f"{threads} thread(s)")
        trained.append(copy_.state_dict())
    return all(torch.equal(trained[0][k], trained[1][k]) for k in trained[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="threads of the timed steps")
    p.add_argument("--batches", type=int, default=20, help="measured batches of each kind")
    p.add_argument("--check-steps", type=int, default=60, help="warm-up steps of the thread check")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    phases = {}
    calls, phases["transcripts"] = timed(toy_model.transcripts, ev.play_every_problem, args.seed, toy.KNOBS)
    known = toy_model.in_line(toy_model.facts())
    tok, phases["tokenizer"] = timed(toy_model.tokenizer_for, calls, known)
    (rows, fact_rows), phases["rows"] = timed(toy_model.encoded_rows, tok, calls, known, args.seed)
    model = toy_model.fresh_model(tok)
    rng = random.Random(args.seed)
    habit = [b for _ in range(-(-args.batches // 8)) for b in toy_model.similar_lengths(rows, rng)][:args.batches]
    fact = [rng.sample(fact_rows, toy_model.FACT_BATCH) for _ in range(args.batches)]
    steps = toy_model.WARMUP_STEPS
    counts = {"habit": steps, "fact": int(steps * toy_model.FACT_SHARE) + steps // toy_model.FACT_EVERY}
    torch.set_num_threads(args.threads)
    print(f"toy model of seed {args.seed}: {sum(q.numel() for q in model.parameters()):,} parameters, "
          f"{len(rows):,} habit rows, {len(fact_rows):,} fact rows; steps timed on {args.threads} thread(s)")
    print(f"{'step':<7}{'prompt':>8}{'compl.':>8}{'padding':>9}{'warm-up':>10}{'Python':>9}{'head on compl.':>16}"
          f"{'bare':>8}{'warm-up / bare':>16}")
    for kind, batches in (("habit", habit), ("fact", fact)):
        prompt = statistics.mean(sum(len(q) for q, _ in b) for b in batches)
        completion = statistics.mean(sum(len(c) for _, c in b) for b in batches)
        padded = statistics.mean(len(b) * max(len(q) + len(c) for q, c in b) for b in batches)
        warm = step_time(model, lambda b: toy_model.batch_loss(model, b)[0], batches)
        python = statistics.median(timed(toy_model.padded, b)[1] for b in batches)
        head = step_time(model, lambda b: head_on_completions_loss(model, b), batches)
        bare = bare_time(model, batches)
        print(f"{kind:<7}{prompt:>8.0f}{completion:>8.0f}{(padded - prompt - completion) / padded:>9.0%}"
              f"{warm * 1e3:>8.0f}ms{python * 1e3:>7.1f}ms{head * 1e3:>14.0f}ms{bare * 1e3:>6.0f}ms"
              f"{warm / bare:>16.2f}")
        phases[f"{kind} steps ({counts[kind]})"] = warm * counts[kind]
    total = sum(phases.values())
    print(f"the build, by stage (the warm-up's steps projected from the medians above, {args.threads} thread(s)):")
    for name, seconds in phases.items():
        print(f"  {name:<22}{seconds / 60:>6.2f} min  {seconds / total:>5.0%}")
    print(f"  {'total':<22}{total / 60:>6.2f} min")
    same = same_on_two_threads(model, rows, fact_rows, args.seed, args.check_steps)
    print(f"warm_up, {args.check_steps} steps on 1 thread and on 2: {'the same' if same else 'DIFFERENT'} parameters")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
