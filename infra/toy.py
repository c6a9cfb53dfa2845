"""The toy world (`--model toy`): a 0.76M-parameter model that plays every role of every workflow, built in minutes.

What it is for: watching the paper's mechanisms play out on a laptop. A noisy scripted oracle plays the real
workflows (the caller passes its rollout in) on every one-digit arithmetic problem; a small BPE tokenizer is
trained on the transcripts; a small Llama is warmed up on them by supervised learning. Each role of the oracle
has two habits, a careful one that works the problem out (`3 + 4 = 7.`, then the answer) and a hurried one that
does not, and a knob (`KNOBS`) sets how often it is careful. The warm-up copies those habits, so the model starts
with every role's format and a middling skill in each, and GRPO has a behaviour to reinforce that carries over to
problems it has not trained on: being careful. What it is not: a model of the paper's 0.6B-4B models (the README's
"The toy world" says what a toy world can and cannot show).

    python train.py --model toy --workflow voting --policy ip     # builds the toy model once per seed (~3 min)
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from typing import Callable

import torch
import transformers

from infra.models import CACHE_DIR, CHATML

VERSION = 4  # part of the cache folder's name: bump it when the recipe below changes
KNOBS = {  # how often each role of the oracle takes its careful habit (the rest of the time: its hurried one)
    "solve": 0.5,       # generators, workers, Eval-Opt retries: the answer is right exactly when careful
    "select": 0.5,      # aggregator: careful picks a right candidate when there is one; hurried picks at random
    "judge": 0.3,       # evaluator: careful verdicts are right; hurried ones are a coin flip (about 65% right)
    "synthesise": 0.5,  # synthesizer: careful works the answer out; hurried copies the first solution's answer
}
EPISODES = {"single": 16, "voting": 2, "evalopt": 2, "orchworkers": 2}  # oracle episodes per problem and workflow
SHAPE = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=1024)  # 0.76M parameters with its ~1,000-token vocabulary
VOCAB, WARMUP_STEPS, BATCH, LR = 1024, 1000, 32, 3e-3  # 1,000 steps: about 3 minutes on 2 cores
STRATEGIES = ["Work it out step by step.", "Count on from the larger number.", "Check with the inverse operation.",
              "Split a number into tens and ones.", "Use a number line."]


def folder(seed: int) -> str:
    return os.path.join(CACHE_DIR, f"toy-v{VERSION}-seed{seed}")


def ready(seed: int) -> bool:
    return os.path.isfile(os.path.join(folder(seed), "model.safetensors"))


# ---------------------------------------------------------------- the oracle

@dataclass
class Said:
    """What the oracle says to one call: the engine's output record, as the rollout reads it."""
    completion_ids: list[int]
    text: str
    truncated: bool = False
    logprobs: list[float] | None = None


_PROBLEM = re.compile(r"What is (\d+) ([+\-×]) (\d+)\?")
_BOXED_NUMBER = re.compile(r"\\boxed\{(-?\d+)\}")
_SOLUTION = re.compile(r"--- Solution (\d+) ---\n(.*?)(?=\n\n--- Solution|\n\n[A-Z][^\n]*$|\Z)", re.S)


def oracle_text(role: str, prompt: str, rng: random.Random, knobs: dict[str, float]) -> str:
    """The oracle's answer for a call of `role` (a call name) to `prompt` (the rendered chat)."""
    a, op, b = _PROBLEM.findall(prompt)[-1]  # the last problem: the one-shot example comes first
    r = {"+": int(a) + int(b), "-": int(a) - int(b), "×": int(a) * int(b)}[op]
    work = f"{a} {op} {b} = {r}."
    role = re.sub(r"\d+$", "", role)
    if role == "orchestrator":
        return "\n".join(f"STRATEGY {i}: {s}" for i, s in enumerate(rng.sample(STRATEGIES, 3), 1))
    if role in ("generator", "worker"):
        if rng.random() < knobs["solve"]:
            return f"{work}\n\n\\boxed{{{r}}}"
        return f"\\boxed{{{r + rng.choice([-3, -2, -1, 1, 2, 3])}}}"
    answers = [(int(k), _BOXED_NUMBER.findall(t)) for k, t in _SOLUTION.findall(prompt)]
    if role == "aggregator":
        right = [k for k, found in answers if found and int(found[-1]) == r]
        if rng.random() < knobs["select"]:
            return f"{work} Solution {right[0]} says {r}.\n\n\\boxed{{{right[0]}}}" if right else \
                f"{work} No solution says {r}.\n\n\\boxed{{1}}"
        return f"\\boxed{{{rng.randint(1, len(answers))}}}"
    if role == "synthesizer":
        if rng.random() < knobs["synthesise"] or not answers or not answers[0][1]:
            return f"{work}\n\n\\boxed{{{r}}}"
        return f"\\boxed{{{answers[0][1][-1]}}}"
    attempt = _BOXED_NUMBER.findall(prompt.rsplit("<|im_start|>user", 1)[0])  # evaluator: the latest attempt
    if rng.random() < knobs["judge"]:
        said = attempt[-1] if attempt else "nothing"
        verdict = "Correct" if attempt and int(attempt[-1]) == r else "Incorrect"
        return f"{work} The answer says {said}.\n\n\\boxed{{{verdict}}}"
    return f"\\boxed{{{rng.choice(['Correct', 'Incorrect'])}}}"


def chatml(messages: list[dict], generation_prompt: bool = True) -> str:
    """The ChatML text of `messages` (what models.CHATML renders), ending in the assistant header if asked."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


class Oracle:
    """A sampling engine that answers with `oracle_text`. Prompts and outputs are UTF-8 bytes (the toy tokenizer
    is trained on the transcripts afterwards); `adapters` carry the call names (the caller routes a name to
    itself)."""

    def __init__(self, seed: int, knobs: dict[str, float]):
        self.rng, self.knobs = random.Random(seed), knobs

    def generate(self, prompts: list[list[int]], adapters: list[str], desc: str = "") -> list[Said]:
        texts = [oracle_text(name, bytes(ids).decode("utf-8"), self.rng, self.knobs)
                 for ids, name in zip(prompts, adapters)]
        return [Said(list(t.encode("utf-8")), t) for t in texts]


def transcripts(play: Callable, seed: int, knobs: dict[str, float]) -> list[tuple[list[dict], str]]:
    """(prompt messages, completion) of every call of the oracle's episodes. `play(workflow, n, engine, encode)`
    runs the caller's workflows on every problem and returns the episodes."""
    engine, rows = Oracle(seed, knobs), []
    for workflow, n in EPISODES.items():
        for ep in play(workflow, n, engine, lambda messages: list(chatml(messages).encode("utf-8"))):
            rows += [(c.messages, c.text) for c in ep.calls]
    return rows


# ---------------------------------------------------------------- tokenizer, model, warm-up

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
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>")
    fast.chat_template = CHATML
    return fast


def warm_up(model, rows: list[tuple[list[int], list[int]]], seed: int, steps: int = WARMUP_STEPS) -> list[float]:
    """Supervised learning on (prompt ids, completion ids + EOS) rows, the loss on completion tokens only; AdamW
    with a linear warm-up (50 steps, fewer in a short run) and a linear decay to 0. Returns each step's loss."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    warm = max(1, min(50, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, (steps - s) / max(steps - warm, 1)))
    model.train()
    losses = []
    for _ in range(steps):
        batch = rng.sample(range(len(rows)), min(BATCH, len(rows)))
        width = max(len(rows[i][0]) + len(rows[i][1]) for i in batch)
        ids = torch.full((len(batch), width), 0, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for j, i in enumerate(batch):  # right padding; labels only on the completion
            p, c = rows[i]
            ids[j, :len(p) + len(c)] = torch.tensor(p + c)
            labels[j, len(p):len(p) + len(c)] = torch.tensor(c)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return losses


def build(seed: int, play: Callable, knobs: dict[str, float] | None = None, steps: int = WARMUP_STEPS,
          out: str | None = None) -> str:
    """Build the toy model of `seed` into `out` (default: its cache folder), once: transcripts, tokenizer, a
    fresh Llama, the warm-up; written aside and renamed, so a crash never leaves a half folder. Deterministic:
    the same seed gives the same files."""
    out = out or folder(seed)
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        return out
    knobs = knobs or KNOBS
    print(f"[toy] building the toy model of seed {seed} into {out} (once; about 3 minutes)")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        calls = transcripts(play, seed, knobs)
        tokenizer = train_tokenizer([chatml(m + [{"role": "assistant", "content": t}], False) for m, t in calls])
        rows = [(tokenizer(chatml(m), add_special_tokens=False).input_ids,
                 tokenizer(t, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]) for m, t in calls]
        config = transformers.LlamaConfig(vocab_size=len(tokenizer), tie_word_embeddings=True, **SHAPE,
                                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                          bos_token_id=None)
        model = transformers.LlamaForCausalLM(config)
        losses = warm_up(model, rows, seed, steps)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval().save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    with open(os.path.join(tmp, "toy.json"), "w") as f:
        json.dump({"seed": seed, "knobs": knobs, "rows": len(rows), "steps": steps, "loss_first": losses[0],
                   "loss_last": sum(losses[-20:]) / len(losses[-20:])}, f, indent=1)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
