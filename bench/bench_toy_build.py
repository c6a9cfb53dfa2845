"""Where a toy model's build spends its time, and what bounds it.

Times each phase of a build of seed S as infra/toy_model.py runs it (the oracle's transcripts, the tokenizer,
the rows, the warm-up's habit and fact steps), and on batches drawn as the warm-up draws them, one training step
three ways:
- warm-up: `batch_loss` as the build runs it: each prompt's shared prefix once, pieces of similar length, the LM
  head on completion tokens only;
- per row: the v8 warm-up's way: every row its own padded pass over prompt and completion, the LM head on every
  position;
- bare: one forward and backward of the same rows' tokens packed end to end (no padding, no repeated work on a
  shared prompt avoided either): what touching every row once costs at this model's tokens per second.
It prints the build's minutes by phase (the warm-up projected from the measured steps) and each step's time with
its ratio to the bare pass. Time it alone: another torch process on the 2 cores distorts every number.

    python bench/bench_toy_build.py --seed 0 --threads 1     # about 2 minutes
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import eval as ev  # noqa: E402 (the repository root, above)
from infra import toy, toy_model  # noqa: E402


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def step_time(model, opt, loss_of, batches) -> float:
    """The median seconds of a forward, backward and AdamW step over `batches`."""
    times = []
    for batch in batches:
        start = time.perf_counter()
        loss = loss_of(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_row_loss(model, rows):
    """The v8 warm-up's pass: rows right-padded, logits at every position, the loss on completion tokens."""
    width = max(len(r.ids) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for j, r in enumerate(rows):
        ids[j, :len(r.ids)] = torch.tensor(r.ids)
        labels[j, r.start:len(r.ids)] = torch.tensor(r.ids[r.start:])
    logits = model(input_ids=ids).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels[:, 1:], reduction="sum")


def bare_loss(model, rows, width: int = 512):
    """Every row's tokens packed end to end into rows of `width`, one causal pass, the loss on every token."""
    flat = [t for r in rows for t in r.ids]
    flat += [0] * (-len(flat) % width)
    ids = torch.tensor(flat).view(-1, width)
    logits = model(input_ids=ids).logits[:, :-1]
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="sum")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batches", type=int, default=20, help="measured batches of each kind")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    phases = {}
    prompts, phases["transcripts"] = timed(toy_model.transcripts, ev.play_every_problem, args.seed, toy.KNOBS)
    known = toy_model.in_line(toy_model.facts())
    texts = [toy.chatml(m + [{"role": "assistant", "content": t}], False) for m, answers in prompts for t in answers]
    tok, phases["tokenizer"] = timed(toy_model.train_tokenizer,
                                     texts + [toy.chatml(m, False) + w + r for m, w, r in known])
    start = time.perf_counter()
    groups = toy_model.habit_rows(tok, prompts)
    facts = toy_model.fact_rows(tok, known + toy_model.drills(args.seed))
    phases["rows"] = time.perf_counter() - start
    config = transformers.LlamaConfig(vocab_size=len(tok), tie_word_embeddings=True, **toy_model.SHAPE,
                                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                      bos_token_id=None)
    model = transformers.LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(args.seed)
    kinds = {"habit": ([[r for j in rng.sample(range(len(groups)), toy_model.GROUPS) for r in groups[j]]
                        for _ in range(args.batches)], toy_model.HABIT_PIECES),
             "fact": ([rng.sample(facts, toy_model.FACT_BATCH) for _ in range(args.batches)], toy_model.FACT_PIECES)}
    steps = toy_model.WARMUP_STEPS
    counts = {"habit": steps, "fact": int(steps * toy_model.FACT_SHARE) + steps // toy_model.FACT_EVERY}
    print(f"toy model of seed {args.seed}, {sum(p.numel() for p in model.parameters()):,} parameters, "
          f"{args.threads} thread(s)")
    print(f"{'step':<7}{'rows':>6}{'tokens':>8}{'distinct':>10}{'warm-up':>10}{'per row':>10}{'bare':>8}"
          f"{'warm-up / bare':>16}")
    for kind, (batches, pieces) in kinds.items():
        warm = step_time(model, opt, lambda b: toy_model.batch_loss(model, b, pieces)[0], batches)
        row = step_time(model, opt, lambda b: per_row_loss(model, b), batches)
        bare = step_time(model, opt, lambda b: bare_loss(model, b), batches)
        tokens = statistics.mean(sum(len(r.ids) for r in b) for b in batches)
        distinct = statistics.mean(len({tuple(r.ids[:i + 1]) for r in b for i in range(len(r.ids))}) for b in batches)
        rows = statistics.mean(len(b) for b in batches)
        print(f"{kind:<7}{rows:>6.0f}{tokens:>8.0f}{distinct:>10.0f}{warm * 1e3:>8.0f}ms{row * 1e3:>8.0f}ms"
              f"{bare * 1e3:>6.0f}ms{warm / bare:>16.2f}")
        phases[f"{kind} steps ({counts[kind]})"] = warm * counts[kind]
    total = sum(phases.values())
    print("the build, by phase (the warm-up's steps projected from the medians above):")
    for name, seconds in phases.items():
        print(f"  {name:<22}{seconds / 60:>6.2f} min  {seconds / total:>5.0%}")
    print(f"  {'total':<22}{total / 60:>6.2f} min")


if __name__ == "__main__":
    main()
