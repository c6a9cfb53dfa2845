"""Where a toy model's careful habits go wrong, step by step (docs/findings/history.md, the calibration of v7-v9).

Plays Eval-Opt (2 episodes a problem), Voting and Orch-Workers (1 each) on all 243 problems with the seed's base
toy model at the calibration's sampling settings, and counts, for the careful outputs: the evaluator's check line
part by part (the attempt, operand and problem's number copied, the arithmetic, the direction, the verdict), the
aggregator's and synthesizer's written-down lists and their picks, the orchestrator's plans, and the workers' right
answers under a suited and an unsuited strategy. Then where the single agent's answer goes: the model's probability,
teacher-forced after `a op b = `, of the right answer and of each answer off by 1, 2 or 3 (the oracle's: 0.52, and
0.08 each). About a minute on one core once the model is built. `--temperature` samples and reads the mass at
another temperature (the calibration's is 1).

    python bench/toy_reading.py --seed 0
    python bench/toy_reading.py --seed 0 --temperature 0.9
"""
import argparse
import collections
import os
import random
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import eval as ev  # noqa: E402 (the repository root, above)
import policies  # noqa: E402
from infra import checkpoints  # noqa: E402
from toyworld import calibration, reading, toy, toy_model  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seed", type=int, default=0, help="the toy model's seed (built first if need be)")
parser.add_argument("--temperature", type=float, default=calibration.TEMPERATURE,
                    help="sampling temperature, also applied to the answer's mass (default: the calibration's)")
args = parser.parse_args()
seed, temperature = args.seed, args.temperature
READERS = {"aggregator": ("select", "Answers", toy.select),
           "synthesizer": ("synth", "Workers say", toy.synthesise)}
toy_model.build(seed, ev.play_every_problem)
model, tok = policies.load_model("toy", torch.float32, "cpu", seed)
engine = policies.HFEngine(model, tok, calibration.MAX_NEW_TOKENS, temperature)
encode = policies.chat_encoder(tok)
checkpoints.seed_everything(seed)
c = collections.Counter()
for wf, n in (("evalopt", 2), ("voting", 1), ("orchworkers", 1)):
    for e in ev.play_every_problem(wf, n, engine, encode, lambda name: name):
        for call in e.calls:
            prompt = tok.decode(call.prompt_ids)
            role = re.sub(r"\d+$", "", call.name)
            s = reading.read_prompt(prompt)
            t = call.text.strip()
            if role == "evaluator":
                m = re.match(r"Check: (-?\d+) ([+\-÷]) (\d+) = (-?\d+)( r (\d+))?; "
                             r"the problem has (\d+)(: too (high|low))?\.", t)
                if not m:
                    c["judge/other"] += 1
                    continue
                c["judge/careful"] += 1
                w, op, b, r, _, rem, a, _, way = m.groups()
                c["judge/w_copied"] += int(w) == s.attempt
                c["judge/b_copied"] += int(b) == s.b
                c["judge/a_copied"] += int(a) == s.a
                want, holds = toy.inverse_check(s, int(w))
                c["judge/arith_right"] += t.startswith(f"Check: {want};")
                wrong = s.attempt != s.answer
                c["judge/dir_given_wrong"] += wrong
                if wrong and way:
                    c["judge/dir_right"] += (way == "high") == (s.attempt > s.answer)
                verdict = "Incorrect" in t
                c["judge/verdict_matches_own_line"] += verdict == bool(way)
                c["judge/verdict_right"] += verdict == wrong
            elif role in READERS:  # the aggregator and the synthesizer: a list written down, then a pick
                key, head, careful_habit = READERS[role]
                m = re.match(head + r" ([-\d, none]+):", t)
                c[f"{key}/all"] += 1
                if m:
                    c[f"{key}/careful"] += 1
                    c[f"{key}/list_right"] += m.group(1) == toy.listed(s.candidates)
                    c[f"{key}/right"] += reading.judged(call.name, prompt, call.text)["right"]
                    careful = careful_habit(s, True, random.Random(0))  # the oracle, same prompt
                    c[f"{key}/oracle_right"] += reading.judged(call.name, prompt, careful)["right"]
            elif role == "orchestrator":
                c["plan/all"] += 1
                lines = re.findall(r"STRATEGY \d: (.+)", t)
                c["plan/all_suited"] += bool(lines) and all(reading.SUITED.get(x.strip()) == s.op for x in lines)
                c["plan/fixed_order"] += [x.strip() for x in lines] == reading.STRATEGIES[s.op]
            elif role == "worker" and s.strategy:
                suited = reading.SUITED.get(s.strategy) == s.op
                right = reading.judged(call.name, prompt, call.text)["right"]
                c[f"work/{'suited' if suited else 'unsuited'}"] += 1
                c[f"work/{'suited' if suited else 'unsuited'}_right"] += right
for k in sorted(c):
    print(f"{k:32s} {c[k]}")


def answer_mass(head: str, x: int, rest: str | None = None) -> float:
    """The model's probability of writing `x` after `head` (a prompt ending in `a op b = `), up to the token that
    ends the line (`rest` follows, as the habit writes it), under the tokenizer's own split of the whole line (`= -`
    is one token)."""
    hid = tok(head, add_special_tokens=False).input_ids
    rest = f".\n\n\\boxed{{{x}}}" if rest is None else rest  # the solver's line as it goes on
    full = tok(head + f"{x}{rest}", add_special_tokens=False).input_ids
    k = next((i for i, (a, b) in enumerate(zip(hid, full)) if a != b), len(hid))
    names = tok.convert_ids_to_tokens(full)
    end = next(i for i in range(k, len(full)) if "." in names[i]) + 1
    with torch.no_grad():
        logits = model(torch.tensor([full[:end]])).logits[0, k - 1:end - 1] / temperature  # (end-k, V)
        logp = torch.log_softmax(logits, -1)
    return float(logp[torch.arange(end - k), torch.tensor(full[k:end])].sum().exp())


mass = [0.0] * 7  # offsets -3..3 from the answer
episodes = ev.play_every_problem("single", 1, toy.Oracle(seed), lambda m: list(toy.chatml(m).encode("utf-8")))
prompts = [toy.chatml(e.calls[0].messages) for e in episodes]  # the single agent's, one per problem
problems = [reading.read_prompt(p) for p in prompts]
for prompt, s in zip(prompts, problems):
    for i in range(7):
        mass[i] += answer_mass(prompt + f"{s.a} {s.op} {s.b} = ", s.answer + i - 3) / len(prompts)
print(f"single agent's answer at temperature {temperature}, by offset from the right one (oracle: 0.08 each, "
      "0.52 at 0):")
print("  ".join(f"{i - 3:+d}: {m:.3f}" for i, m in enumerate(mass)))
drill = toy.chatml([{"role": "user", "content": "Work it out."}])  # the facts as the warm-up drills them
known = [answer_mass(drill + f"{s.a} {s.op} {s.b} = ", s.answer, ".") for s in problems]
print(f"the same facts as a drill (`Work it out.`) at temperature {temperature}, right: "
      f"{sum(known) / len(known):.3f}")
