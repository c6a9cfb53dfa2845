"""The toy model (`--model toy`): a tokenizer and a small Llama warmed up on the toy oracle's transcripts.

What it does: plays the oracle (infra/toy.py) through the real workflows on all 243 one-digit problems (the caller
passes its rollout in), keeps a balanced share of rows for each habit (`ROWS`: every non-solver role a fair
share, half of them careful), trains a byte-level BPE tokenizer on them, and warms a fresh Llama up on them by
supervised learning. Built once per seed into the cache, in about 30 minutes: the warm-up runs on one thread,
since floating-point sums differ with the thread count, so that a seed gives the same model whatever the
machine's cores (and two seeds build side by side in the time of one). What it is not: calibrated by
construction; `python -m infra.toy --calibrate` checks that the warmed-up model reproduces each habit
(infra/calibration.py).

    python train.py --model toy --workflow voting --policy ip     # builds the toy model of --seed on first use
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch
import transformers
from tqdm import tqdm

from infra.models import CHATML, cache_keyword
from infra.toy import KNOBS, Oracle, Seen, chatml, folder, habit_of, inverse_check, oracle_texts, select, synthesise

EPISODES = {"single": 24, "voting": 28, "evalopt": 56, "orchworkers": 24}  # oracle episodes per problem, workflow
# Rows of each kind; the warm-up sees each about 2.5 times. (Half as many, seen 5 times, left the model's careful
# rates 0.05-0.07 off its rows' in some habits, a different one in each build: it learned each prompt's draw.)
ROWS = {"solve": 8000, "work": 10000, "retry": 8000, "select": 6000, "judge": 8000, "plan": 6000,
        "synthesise": 6000}
SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=1024)  # 0.76M parameters with its ~1,000-token vocabulary
VOCAB = 1024
# Supervised steps of BATCH rows. (v7's 2,000 on half the rows left a solver right 0.01-0.135 less often than its
# rows, a different amount in each seed: the right answer's mass spread onto its neighbours, the guesses' numbers.)
WARMUP_STEPS = 4000
BATCH = 32
PROMPT_ROWS = 4  # the rows a warm-up prompt stands for: a habit batch is BATCH / PROMPT_ROWS prompts
ANSWERS = 32  # the oracle answers each prompt this often; a distinct answer weighs its share of PROMPT_ROWS
GROUPS = BATCH // PROMPT_ROWS  # prompts a habit batch
HABIT_PIECES, FACT_PIECES = 2, 4
LR = 3e-3
# A batch's summed token losses over a constant, not their mean: with the mean, a token of a batch of short rows
# weighs more than one of a batch of long rows, and the batches are cut by length, so the first token of a long
# (careful) output weighed less than that of a short (hurried) one: the model chose careful 0.40 of the time
# where its rows had 0.49. The constant is about a habit batch's tokens.
TOKEN_NORM = 512
FACT_SHARE, FACT_EVERY, FACT_BATCH = 0.4, 4, 128  # a first phase of 0.4 x steps fact batches, then one in 5
# The problems' own facts (`7 × 6 = 42`, 243 of some 9,000 fact rows) come this many times: once each, a seed's
# times table could end up right only 0.69 of the time in its own line (v7 seeds 3 and 5), and its solver with it.
PROBLEM_FACT_COPIES = 4
READER_DRILLS = 3000


def row_kind(name: str, prompt: str) -> str:
    """The habit a warm-up row teaches; a worker (a solver with a strategy) is its own kind."""
    habit = habit_of(name.rstrip("0123456789"), prompt)
    return "work" if habit == "solve" and "your main approach" in prompt else habit


def transcripts(play: Callable, seed: int, knobs: dict[str, float]) -> list[tuple[list[dict], list[str]]]:
    """(prompt messages, the oracle's ANSWERS answers to it) for `ROWS[kind] / ANSWERS` prompts of each kind,
    drawn at random from every call of the oracle's episodes (all of a kind when it has fewer).
    `play(workflow, n, engine, encode)` runs the caller's workflows on every problem and returns the
    episodes."""
    engine, by_kind = Oracle(seed, knobs), {kind: [] for kind in ROWS}
    for workflow, n in EPISODES.items():
        for ep in play(workflow, n, engine, lambda messages: list(chatml(messages).encode("utf-8"))):
            for c in ep.calls:
                by_kind[row_kind(c.name, chatml(c.messages))].append((c.messages, c.name))
    rng, prompts = random.Random(seed), []
    for kind, wanted in ROWS.items():
        for messages, name in rng.sample(by_kind[kind], min(wanted // PROMPT_ROWS, len(by_kind[kind]))):
            prompts.append((messages, oracle_texts(name, chatml(messages), rng, knobs, ANSWERS)))
    rng.shuffle(prompts)
    return prompts


def facts() -> list[tuple[str, str]]:
    """(arithmetic, its result), e.g. (`23 ÷ 4`, `5 r 3`), of every piece of arithmetic the habits use: the 243
    problems, the evaluator's inverse checks of answers off by up to 3, and the retries' nudges by 1 or 2. A real
    base model knows its tables from pretraining; the toy model learns them here first, so that the warm-up's rows
    teach habits (how often a role is careful) on top of arithmetic it can already do."""
    found = {}
    for a in range(1, 10):
        for b in range(1, 10):
            for op, r in (("+", a + b), ("-", a - b), ("×", a * b)):
                found[f"{a} {op} {b}"] = r
                for w in range(r - 3, r + 4):  # the evaluator's check of an attempt w (infra/toy.py inverse_check)
                    if op == "×":
                        found[f"{w} ÷ {b}"] = f"{w // b} r {w % b}"
                    else:
                        found[f"{w} {'-' if op == '+' else '+'} {b}"] = w - b if op == "+" else w + b
    for x in range(-14, 88):  # a hurried retry's nudge of the last answer
        for k in (1, 2):
            found[f"{x} + {k}"], found[f"{x} - {k}"] = x + k, x - k
    return [(q, str(r)) for q, r in sorted(found.items())]


def in_line(worked: list[tuple[str, str]]) -> list[tuple[list[dict], str, str]]:
    """Each fact as a drill in the assistant's own line (`23 ÷ 4 = ` then `5 r 3.`), after a prompt that does not
    show the operands: the model must read them off its own line, as every habit does (a table learned as a
    question and its answer is recalled only when the question is the user's). The division checks, two numbers
    each, come twice; the problems' own facts PROBLEM_FACT_COPIES times."""
    out = []
    for arithmetic, result in worked:
        a, op, b = arithmetic.split()
        problem = op != "÷" and {a, b} <= set("123456789")  # one of the 243 problems: a and b digits 1-9
        times = 2 if op == "÷" else PROBLEM_FACT_COPIES if problem else 1
        out += [([{"role": "user", "content": "Work it out."}], f"{arithmetic} = ", f"{result}.")] * times
    return out


def drills(seed: int, per_reader: int | None = None) -> list[tuple[list[dict], str, str]]:
    """(messages, what the assistant has written so far, what it writes next): the careful habits' reading steps
    practised *inside* an output, where the habit needs them. A table learned as a question and its answer is
    recalled when the question is the user's message, not when the operands are the model's own words (seen:
    every fact right alone, the evaluator's check right 68% of the time in its own line). So: every check the
    evaluator can write, from the attempt on (the inverse operation, the number it must equal, which way it is
    off, the verdict), and `per_reader` lists of boxed answers for the aggregator's and the synthesizer's
    plurality, each ending as the habit ends."""
    rng, out = random.Random(seed), []
    per_reader = READER_DRILLS if per_reader is None else per_reader
    for a in range(1, 10):
        for b in range(1, 10):
            for op, r in (("+", a + b), ("-", a - b), ("×", a * b)):
                problem = [{"role": "user", "content": f"What is {a} {op} {b}?"}]
                for w in range(r - 3, r + 4):
                    check, holds = inverse_check(Seen(a, op, b, r, [], None, w, ""), w)
                    head, result = check.split(" = ")
                    way = "" if holds else f": too {'high' if w > r else 'low'}"
                    verdict = "Correct" if holds else "Incorrect"
                    out.append((problem, f"Check: {head} = ",
                                f"{result}; the problem has {a}{way}.\n\n\\boxed{{{verdict}}}"))
    for _ in range(per_reader):
        answer = rng.randint(-8, 81)
        seen = Seen(0, "+", 0, answer, [rng.choice([answer + d for d in range(-3, 4)] + [None])
                                        if rng.random() < 0.1 else answer + rng.randint(-3, 3)
                                        for _ in range(3)], None, None, "")
        problem = [{"role": "user", "content": "Which answer?"}]
        for said in (select(seen, True, rng), synthesise(seen, True, rng)):
            head, rest = said.split(": ", 1)
            out.append((problem, head + ":", " " + rest))
    return out


def drill_row(tokenizer, messages: list[dict], written: str, rest: str) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of one drill: the text tokenized whole (as generation would), the loss on the
    tokens of `rest` and the end of the turn."""
    head = chatml(messages) + written
    enc = tokenizer(head + rest, add_special_tokens=False, return_offsets_mapping=True)
    cut = next(i for i, (start, end) in enumerate(enc.offset_mapping) if end > len(head))
    return enc.input_ids[:cut], enc.input_ids[cut:] + [tokenizer.eos_token_id]


def train_tokenizer(texts: list[str]) -> transformers.PreTrainedTokenizerFast:
    """Byte-level BPE on the transcripts: digits stay single tokens (so a number is spelled, never memorised
    whole), merges may cross spaces (instructions become a few tokens each); ChatML as the chat format."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\d"), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                pad_token="<|im_end|>")
    fast.chat_template = CHATML
    return fast


@dataclass
class Row:
    """One warm-up row: prompt + completion ids, the loss on `ids[start:]`, weighted by how many oracle
    answers it stands for (identical answers to one prompt merge into one row). Its first `shared` tokens
    are a prefix it shares with the other rows of its prompt: a batch runs each distinct prefix once."""
    ids: list[int]
    start: int
    weight: float
    shared: int


def batch_loss(model, rows: list[Row], pieces: int = 1) -> tuple[torch.Tensor, float]:
    """(the loss to step on: the completion tokens' weighted summed losses over TOKEN_NORM, the mean loss
    per token) of a batch of rows, computed in `pieces` passes of rows of similar length (sorted, cut): each
    pass pads to its own longest row, and the passes' losses add up to the batch's."""
    rows = sorted(rows, key=lambda r: (r.shared, r.ids[:r.shared], len(r.ids)))
    size = -(-len(rows) // pieces)
    parts = [piece_loss(model, rows[k:k + size]) for k in range(0, len(rows), size)]
    weighted, weights = sum(p[0] for p in parts), sum(p[1] for p in parts)
    return weighted / TOKEN_NORM, float(weighted.detach() / weights)


def piece_loss(model, rows: list[Row]) -> tuple[torch.Tensor, float]:
    """(the loss to step on: the completion tokens' weighted summed losses over TOKEN_NORM, the mean loss
    per token) of a batch of rows.

    Each distinct prefix runs once, left-padded, into a KV cache; the cache is gathered by row and each
    row's rest runs on top of it, right-padded; only the positions that predict a completion token go
    through the LM head. The gather is differentiable, so the loss and its gradient equal one full pass
    per row up to float rounding (tests/test_toy.py), at the cost of each prompt once."""
    keys: dict[tuple, int] = {}
    prefix_of = [keys.setdefault(tuple(r.ids[:r.shared]), len(keys)) for r in rows]
    prefixes = list(keys)
    width = max(len(p) for p in prefixes)
    ids = torch.zeros((len(prefixes), width), dtype=torch.long)        # (U, P): left-padded prefixes
    mask = torch.zeros((len(prefixes), width), dtype=torch.long)
    for u, p in enumerate(prefixes):
        ids[u, width - len(p):], mask[u, width - len(p):] = torch.tensor(p), 1
    keyword = cache_keyword(model.model.forward)
    cache = transformers.DynamicCache()
    model.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                use_cache=True, **{keyword: cache})
    index = torch.tensor(prefix_of)
    cache.batch_select_indices(index)                                  # (U, ...) -> (B, ...)
    rests = [r.ids[r.shared:] for r in rows]
    length = max(len(x) for x in rests)
    rest_ids = torch.zeros((len(rows), length), dtype=torch.long)     # (B, T): right-padded
    rest_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for j, x in enumerate(rests):
        rest_ids[j, :len(x)], rest_mask[j, :len(x)] = torch.tensor(x), 1
    positions = mask[index].sum(-1, keepdim=True) + torch.arange(length)  # (B, T)
    hidden = model.model(input_ids=rest_ids, attention_mask=torch.cat([mask[index], rest_mask], -1),
                         position_ids=positions, use_cache=True, **{keyword: cache}).last_hidden_state
    # the position before each completion token predicts it: rest column c - 1 predicts rest column c
    pick = [(j, c - 1, x[c], rows[j].weight) for j, (x, r) in enumerate(zip(rests, rows))
            for c in range(max(r.start - r.shared, 1), len(x))]
    row, col, target, weight = (torch.tensor(v) for v in zip(*pick))
    logits = model.lm_head(hidden[row, col])                            # (N, V)
    token_losses = torch.nn.functional.cross_entropy(logits, target, reduction="none")  # (N,)
    return (token_losses * weight).sum(), float(weight.sum())


def habit_rows(tokenizer, prompts: list[tuple[list[dict], list[str]]]) -> list[list[Row]]:
    """Each prompt's rows: one per distinct answer, weighted by how often the oracle gave it, sharing
    the prompt but its last token (whose position predicts the first completion token)."""
    groups = []
    for messages, answers in prompts:
        prompt = tokenizer(chatml(messages), add_special_tokens=False).input_ids
        counts = Counter(answers)
        completions = tokenizer(list(counts), add_special_tokens=False).input_ids
        groups.append([Row(prompt + c + [tokenizer.eos_token_id], len(prompt), n * PROMPT_ROWS / len(answers),
                           len(prompt) - 1)
                       for c, n in zip(completions, counts.values())])
    return groups


def fact_rows(tokenizer, drilled: list[tuple[list[dict], str, str]]) -> list[Row]:
    """The drills' rows (`drill_row`), each sharing with the others of its messages the chat header
    they all start with."""
    headers: dict[str, list[int]] = {}
    rows = []
    for messages, written, rest in drilled:
        prompt, completion = drill_row(tokenizer, messages, written, rest)
        text = chatml(messages)
        header = headers.setdefault(text, tokenizer(text, add_special_tokens=False).input_ids)
        shared = next((i for i, (a, b) in enumerate(zip(header, prompt)) if a != b), min(len(header), len(prompt)))
        rows.append(Row(prompt + completion, len(prompt), 1.0, max(1, min(shared, len(prompt) - 1))))
    return rows


def warm_up(model, groups: list[list[Row]], seed: int, steps: int = WARMUP_STEPS,
            facts: list[Row] | None = None, desc: str = "warm-up") -> list[float]:
    """Supervised learning on the habit rows (GROUPS prompts a batch, each with its answers) and the fact
    rows (FACT_BATCH a batch), both drawn at random, the loss on completion tokens only (`batch_loss`); AdamW
    with a linear warm-up (50 steps, fewer in a short run) and a linear decay to 0. With `facts`, FACT_SHARE
    of the steps are first a phase of fact batches, then every FACT_EVERY-th step is one (so the tables are
    not forgotten). Returns each step's loss per token."""
    rng = random.Random(seed)
    fact_steps = int(steps * FACT_SHARE) if facts else 0
    total = steps + fact_steps + (steps // FACT_EVERY if facts else 0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    warm = max(1, min(50, total // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, (total - s) / max(total - warm, 1)))
    model.train()
    losses = []
    bar = tqdm(range(total), desc=desc, unit="step", mininterval=2, disable=None)
    for i in bar:
        habit_step = i - fact_steps
        if habit_step < 0 or (facts and habit_step % (FACT_EVERY + 1) == FACT_EVERY):
            # a batch of one kind of drill (sorted by length) learns the tables several times slower
            batch, pieces = rng.sample(facts, min(FACT_BATCH, len(facts))), FACT_PIECES
        else:
            batch = [row for group in rng.sample(groups, GROUPS) for row in group]
            pieces = HABIT_PIECES
        loss, per_token = batch_loss(model, batch, pieces)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(per_token)
        if i % 50 == 0:
            bar.set_postfix(loss=f"{per_token:.3f}", refresh=False)
    return losses


def build(seed: int, play: Callable, knobs: dict[str, float] | None = None, steps: int | None = None,
          out: str | None = None) -> str:
    """Build the toy model of `seed` into `out` (default: its cache folder), once: transcripts, tokenizer, a
    fresh Llama, the warm-up; written aside and renamed, so a crash never leaves a half folder."""
    out = out or folder(seed)
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        return out
    knobs, steps = knobs or KNOBS, steps or WARMUP_STEPS
    say = lambda what: print(f"[toy] seed {seed}: {what}", flush=True)  # noqa: E731
    say(f"building its toy model into {out} (once)")
    start = time.time()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        say("the oracle plays every workflow on every problem")
        prompts = transcripts(play, seed, knobs)
        known = in_line(facts())
        say(f"a tokenizer on {len(prompts)} prompts' transcripts")
        texts = [chatml(m + [{"role": "assistant", "content": t}], False) for m, answers in prompts for t in answers]
        tokenizer = train_tokenizer(texts + [chatml(m, False) + w + r for m, w, r in known])
        groups, drilled = habit_rows(tokenizer, prompts), fact_rows(tokenizer, known + drills(seed))
        config = transformers.LlamaConfig(vocab_size=len(tokenizer), tie_word_embeddings=True, **SHAPE,
                                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                          bos_token_id=None)
        model = transformers.LlamaForCausalLM(config)
        losses = warm_up(model, groups, seed, steps, drilled, desc=f"[toy] seed {seed}: warm-up")
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, "toy.json"), "w") as f:
        json.dump({"seed": seed, "knobs": knobs, "prompts": len(groups), "rows": sum(map(len, groups)),
                   "facts": len(drilled), "steps": steps, "loss_first": losses[0],
                   "loss_last": sum(losses[-20:]) / len(losses[-20:]), "minutes": (time.time() - start) / 60},
                  f, indent=1)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    say(f"built in {(time.time() - start) / 60:.1f} minutes")
    return out
