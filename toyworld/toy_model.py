"""The toy model (`--model toy`): a tokenizer and a small Llama warmed up on the toy oracle's
transcripts.

What it does: plays the oracle (toyworld/toy.py) through the real workflows on all 243 one-digit
problems (the caller passes its rollout in), keeps a balanced share of rows for each habit (`ROWS`:
every non-solver role a fair share, half of them careful), trains a byte-level BPE tokenizer on
them, and warms a fresh Llama up on them by supervised learning. Built once per seed into the cache
(BUILD_MINUTES, below), with a line per stage and a progress bar over the warm-up's steps; the
study's seeds 0-5 are committed as built (COMMITTED) and copied. The warm-up gives the same model,
bit for bit, on one thread or two (bench/bench_toy_build.py checks it), so a build takes both cores
and the study builds two seeds side by side, one thread each; not on another kind of CPU (torch's
AVX2 and AVX512 kernels differ in the last bits: toy.json says which built it). What it is not:
calibrated by construction; `python -m toyworld.toy --calibrate` checks that the warmed-up model
reproduces each habit (toyworld/calibration.py).

    # copies (0-5) or builds the seed's model
    python train.py --model toy --workflow voting --policy ip
    # seed 0 built afresh, to hold against its copy
    python -m toyworld.toy --build --seed 0 --out /tmp/seed0
"""
from __future__ import annotations

import json
import os
import random
import shutil
import tarfile
import time
from typing import Callable

import torch
import transformers
from tqdm import tqdm

from infra.models import CHATML
from infra.roles import role_type
from toyworld.reading import Seen, habit_of
from toyworld.toy import KNOBS, VERSION, Oracle, chatml, folder, inverse_check, select, synthesise

# oracle episodes per problem, workflow
EPISODES = {"single": 24, "voting": 28, "evalopt": 56, "orchworkers": 24}
# Rows of each kind; the warm-up sees each about 2.5 times. (Half as many, seen 5 times, left the
# model's careful rates 0.05-0.07 off its rows' in some habits, a different one in each build: it
# learned each prompt's draw.)
ROWS = {"solve": 8000, "work": 10000, "retry": 8000, "select": 6000, "judge": 8000, "plan": 6000,
        "synthesise": 6000}
# 770,944 parameters with its 1,024-token vocabulary
SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=1024)
VOCAB = 1024
# Supervised steps of BATCH rows. (v7's 2,000 on half the rows left a solver right 0.01-0.135 less
# often than its rows, a different amount in each seed: the right answer's mass spread onto its
# neighbours, the guesses' numbers.)
WARMUP_STEPS = 4000
BATCH = 32
# The study's candidate seeds 0-5 as built, one tar each (docs/findings/builds.jsonl has their
# records): `build` copies them.
COMMITTED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                         "findings", "models")
# a build on the 2-core machine, measured (bench/times.json; tests/test_docs.py holds them equal)
BUILD_MINUTES = 18
LR = 3e-3
# A batch's summed token losses over a constant, not their mean: with the mean, a token of a batch
# of short rows weighs more than one of a batch of long rows, and the batches are cut by length, so
# the first token of a long (careful) output weighed less than that of a short (hurried) one: the
# model chose careful 0.40 of the time where its rows had 0.49. The constant is about a habit
# batch's tokens.
TOKEN_NORM = 512
# a first phase of 0.4 x steps fact batches, then one in 5
FACT_SHARE, FACT_EVERY, FACT_BATCH = 0.4, 4, 128
# The problems' own facts (`7 × 6 = 42`, 243 of some 9,000 fact rows) come this many times: once
# each, a seed's times table could end up right only 0.69 of the time in its own line (v7 seeds 3
# and 5), and its solver with it.
PROBLEM_FACT_COPIES = 4


def row_kind(name: str, prompt: str) -> str:
    """The habit a warm-up row teaches; a worker (a solver with a strategy) is its own kind."""
    habit = habit_of(role_type(name), prompt)
    return "work" if habit == "solve" and "your main approach" in prompt else habit


def transcripts(play: Callable, seed: int, knobs: dict[str, float]) -> list[tuple[list[dict], str]]:
    """(prompt messages, completion) rows: every call of the oracle's episodes, then `ROWS[kind]` of
    each kind drawn at random (all of a kind when it has fewer). `play(workflow, n, engine, encode)`
    runs the caller's workflows on every problem and returns the episodes."""
    engine, by_kind = Oracle(seed, knobs), {kind: [] for kind in ROWS}
    for workflow, n in EPISODES.items():
        for ep in play(workflow, n, engine,
                       lambda messages: list(chatml(messages).encode("utf-8"))):
            for c in ep.calls:
                by_kind[row_kind(c.name, chatml(c.messages))].append((c.messages, c.text))
    rng, rows = random.Random(seed), []
    for kind, wanted in ROWS.items():
        rows += rng.sample(by_kind[kind], min(wanted, len(by_kind[kind])))
    rng.shuffle(rows)
    return rows


def facts() -> list[tuple[str, str]]:
    """(arithmetic, its result), e.g. (`23 ÷ 4`, `5 r 3`), of every piece of arithmetic the habits
    use: the 243 problems, the evaluator's inverse checks of answers off by up to 3, and the
    retries' nudges by 1 or 2. A real base model knows its tables from pretraining; the toy model
    learns them here first, so that the warm-up's rows teach habits (how often a role is careful) on
    top of arithmetic it can already do."""
    found = {}
    for a in range(1, 10):
        for b in range(1, 10):
            for op, r in (("+", a + b), ("-", a - b), ("×", a * b)):
                found[f"{a} {op} {b}"] = r
                # the evaluator's check of an attempt w (toyworld/toy.py inverse_check)
                for w in range(r - 3, r + 4):
                    if op == "×":
                        found[f"{w} ÷ {b}"] = f"{w // b} r {w % b}"
                    else:
                        inverse = "-" if op == "+" else "+"
                        found[f"{w} {inverse} {b}"] = w - b if op == "+" else w + b
    for x in range(-14, 88):  # a hurried retry's nudge of the last answer
        for k in (1, 2):
            found[f"{x} + {k}"], found[f"{x} - {k}"] = x + k, x - k
    return [(q, str(r)) for q, r in sorted(found.items())]


def in_line(worked: list[tuple[str, str]]) -> list[tuple[list[dict], str, str]]:
    """Each fact as a drill in the assistant's own line (`23 ÷ 4 = ` then `5 r 3.`), after a prompt
    that does not show the operands: the model must read them off its own line, as every habit does
    (a table learned as a question and its answer is recalled only when the question is the user's).
    The division checks, two numbers each, come twice; the problems' own facts PROBLEM_FACT_COPIES
    times."""
    out = []
    for arithmetic, result in worked:
        a, op, b = arithmetic.split()
        # one of the 243 problems: a and b digits 1-9
        problem = op != "÷" and {a, b} <= set("123456789")
        times = 2 if op == "÷" else PROBLEM_FACT_COPIES if problem else 1
        out += [([{"role": "user", "content": "Work it out."}], f"{arithmetic} = ",
                 f"{result}.")] * times
    return out


def drills(seed: int, per_reader: int = 3000) -> list[tuple[list[dict], str, str]]:
    """(messages, what the assistant has written so far, what it writes next): the careful habits'
    reading steps practised *inside* an output, where the habit needs them. A table learned as a
    question and its answer is recalled when the question is the user's message, not when the
    operands are the model's own words (seen: every fact right alone, the evaluator's check right
    68% of the time in its own line). So: every check the evaluator can write, from the attempt on
    (the inverse operation, the number it must equal, which way it is off, the verdict), and
    `per_reader` lists of boxed answers for the aggregator's and the synthesizer's plurality, each
    ending as the habit ends."""
    rng, out = random.Random(seed), []
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


def drill_row(tokenizer, messages: list[dict], written: str,
              rest: str) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids) of one drill: the text tokenized whole (as generation would),
    the loss on the tokens of `rest` and the end of the turn."""
    head = chatml(messages) + written
    enc = tokenizer(head + rest, add_special_tokens=False, return_offsets_mapping=True)
    cut = next(i for i, (start, end) in enumerate(enc.offset_mapping) if end > len(head))
    return enc.input_ids[:cut], enc.input_ids[cut:] + [tokenizer.eos_token_id]


def train_tokenizer(texts: list[str]) -> transformers.PreTrainedTokenizerFast:
    """Byte-level BPE on the transcripts: digits stay single tokens (so a number is spelled, never
    memorised whole), merges may cross spaces (instructions become a few tokens each); ChatML as the
    chat format."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    digits = pre_tokenizers.Split(Regex(r"\d"), "isolated")
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [digits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                                pad_token="<|im_end|>")
    fast.chat_template = CHATML
    return fast


def warm_up(model, rows: list[tuple[list[int], list[int]]], seed: int, steps: int = WARMUP_STEPS,
            fact_rows: list[tuple[list[int], list[int]]] | None = None,
            desc: str = "warm-up") -> list[float]:
    """Supervised learning on (prompt ids, completion ids + EOS) rows, the loss on completion tokens
    only (summed over TOKEN_NORM, `batch_loss`); AdamW with a linear warm-up (50 steps, fewer in a
    short run) and a linear decay to 0. With `fact_rows` (short arithmetic rows, cheap), FACT_SHARE
    of the steps are first a phase of fact batches, then every FACT_EVERY-th step is one (so the
    tables are not forgotten). A tqdm bar (`desc`) shows the steps, the loss and the time left;
    where the output is not a terminal (a log file: the study's builds), a line every tenth of the
    steps says the same. Returns each step's loss."""
    rng = random.Random(seed)
    fact_steps = int(steps * FACT_SHARE) if fact_rows else 0
    total = steps + fact_steps + (steps // FACT_EVERY if fact_rows else 0)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    warm = max(1, min(50, total // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warm, (total - s) / max(total - warm, 1)))
    model.train()
    losses = []
    queue: list[list[tuple[list[int], list[int]]]] = []
    bar = tqdm(range(total), desc=desc, unit="step", mininterval=2, disable=None)
    start, tenth = time.time(), max(1, total // 10)
    for i in bar:
        habit_step = i - fact_steps
        if habit_step < 0 or (fact_rows and habit_step % (FACT_EVERY + 1) == FACT_EVERY):
            batch = [fact_rows[j]
                     for j in rng.sample(range(len(fact_rows)), min(FACT_BATCH, len(fact_rows)))]
        else:
            queue = queue or similar_lengths(rows, rng)
            batch = queue.pop()
        loss, per_token = batch_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(per_token)
        if i % 50 == 0:
            bar.set_postfix(loss=f"{per_token:.3f}", refresh=False)
        if bar.disable and (i + 1) % tenth == 0:
            minutes = (time.time() - start) / 60
            print(
                f"{desc}: step {i + 1:,} of {total:,}, loss {per_token:.3f}, {minutes:.1f} "
                f"minutes, about {minutes * (total - i - 1) / (i + 1):.1f} left", flush=True)
    return losses


def padded(batch: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, labels) of (prompt ids, completion ids) rows, right-padded into one batch; labels only
    on the completion."""
    width = max(len(p) + len(c) for p, c in batch)
    ids = torch.full((len(batch), width), 0, dtype=torch.long)           # (B, T)
    # (B, T): -100 where no loss
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    for j, (p, c) in enumerate(batch):
        ids[j, :len(p) + len(c)] = torch.tensor(p + c)
        labels[j, len(p):len(p) + len(c)] = torch.tensor(c)
    return ids, labels


def batch_loss(model, batch: list[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, float]:
    """(the loss to step on: the completion tokens' summed losses over TOKEN_NORM, the mean loss per
    token) of (prompt ids, completion ids) rows, right-padded into one batch."""
    ids, labels = padded(batch)
    logits = model(input_ids=ids).logits[:, :-1]                          # (B, T-1, V): next-token
    token_losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels[:, 1:],
                                                     reduction="none")
    tokens = (labels[:, 1:] != -100).sum()
    return token_losses.sum() / TOKEN_NORM, float(token_losses.detach().sum() / tokens)


def similar_lengths(rows: list, rng: random.Random, batches: int = 8) -> list[list]:
    """`batches` batches of BATCH rows drawn at random, each of rows of similar length (drawn
    together, sorted by length, cut), in random order: a batch pads to its longest row, so this
    halves the warm-up's padding."""
    drawn = sorted(rng.sample(range(len(rows)), min(BATCH * batches, len(rows))),
                   key=lambda j: len(rows[j][0]) + len(rows[j][1]))
    cut = [[rows[j] for j in drawn[k:k + BATCH]] for k in range(0, len(drawn), BATCH)]
    rng.shuffle(cut)
    return cut


def tokenizer_for(calls: list, known: list):
    """The tokenizer trained on every text a build teaches: the habits' calls and the facts in
    line."""
    said = calls + [(m, written + rest) for m, written, rest in known]
    return train_tokenizer([chatml(m + [{"role": "assistant", "content": t}], False)
                            for m, t in said])


def encoded_rows(tokenizer, calls: list, known: list, seed: int) -> tuple[list, list]:
    """(habit rows, fact rows) as (prompt ids, completion ids + EOS): each call's chat and answer;
    the facts in line and the seed's drills."""
    rows = [(tokenizer(chatml(m), add_special_tokens=False).input_ids,
             tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id])
            for m, t in calls]
    return rows, [drill_row(tokenizer, *d) for d in known + drills(seed)]


def fresh_model(tokenizer) -> transformers.LlamaForCausalLM:
    """A randomly initialised Llama of SHAPE over the tokenizer's vocabulary (from torch's
    generator)."""
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), tie_word_embeddings=True, **SHAPE,
                                      eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return transformers.LlamaForCausalLM(config)


def library_versions() -> dict[str, str]:
    """What a build's bits depend on besides the seed, kept in toy.json: the libraries (the
    tokenizer's merges, the initialisation, the kernels) and the vector instructions torch's kernels
    use (`cpu_capability`: a 30-step build of one seed differs under AVX2 and AVX512). Two builds of
    one seed are the same model only where all of these are."""
    import tokenizers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def committed(seed: int) -> str | None:
    """The study's toy model of `seed` as it was built and calibrated (AVX512, one thread: its
    toy.json), committed in docs/findings/models/ at this VERSION as one tar of the folder a build
    writes; None for a seed the study did not consider."""
    path = os.path.join(COMMITTED, f"toy-v{VERSION}-seed{seed}.tar")
    return path if os.path.isfile(path) else None


def copy_committed(seed: int, out: str) -> str:
    """The committed model of `seed` unpacked into `out` (the cache): the study's instrument bit for
    bit on any CPU, in seconds, where a build takes 18-35 minutes and, on another kind of CPU, makes
    another model."""
    source, tmp = committed(seed), out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(source) as tar:
        tar.extractall(tmp, filter="data")
    with open(os.path.join(tmp, "toy.json")) as f:
        record = json.load(f)
    print(
        f"[toy] seed {seed}: the study's toy model, copied from {os.path.relpath(source)} (built "
        f"in {record['minutes']:.0f} minutes on {record['versions']['cpu_capability']}; python -m "
        f"toyworld.toy --build --seed {seed} --out DIR builds it afresh)", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def build(seed: int, play: Callable, knobs: dict[str, float] | None = None,
          steps: int = WARMUP_STEPS, out: str | None = None) -> str:
    """Build the toy model of `seed` into `out` (default: its cache folder, where a study seed's
    committed model is copied instead), once: transcripts, tokenizer, a fresh Llama, the warm-up;
    written aside and renamed, so a crash never leaves a half folder."""
    # what the committed models are
    study_build = out is None and knobs is None and steps == WARMUP_STEPS
    out = out or folder(seed)
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        return out
    if study_build and committed(seed):
        return copy_committed(seed, out)
    knobs, start = knobs or KNOBS, time.time()
    say = lambda what: print(f"[toy] seed {seed}: {what}", flush=True)  # noqa: E731
    say(f"building the toy model into {out} (once; about {BUILD_MINUTES} minutes on 2 cores)")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        say("playing the oracle through every workflow on all 243 problems (the transcripts)")
        calls, known = transcripts(play, seed, knobs), in_line(facts())
        say(f"training the tokenizer on {len(calls) + len(known):,} texts")
        tokenizer = tokenizer_for(calls, known)
        rows, fact_rows = encoded_rows(tokenizer, calls, known, seed)
        model = fresh_model(tokenizer)
        say(f"warming up a {sum(p.numel() for p in model.parameters()):,}-parameter Llama on "
            f"{len(rows):,} habit rows and {len(fact_rows):,} fact rows, {torch.get_num_threads()} "
            "thread(s)")
        losses = warm_up(model, rows, seed, steps, fact_rows, desc=f"[toy] seed {seed} warm-up")
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, "toy.json"), "w") as f:
        json.dump({"seed": seed, "knobs": knobs, "rows": len(rows), "facts": len(fact_rows),
                   "steps": steps, "loss_first": losses[0],
                   "loss_last": sum(losses[-20:]) / len(losses[-20:]),
                   "minutes": round((time.time() - start) / 60, 1),
                   "threads": torch.get_num_threads(), "versions": library_versions()}, f, indent=1)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    say(f"built in {(time.time() - start) / 60:.1f} minutes")
    return out
