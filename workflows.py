"""Workflows: the roles, the control flow between them, credit, and the roles' prompts.

docs/method.md, "Workflows", describes them. A workflow is a plain Python generator per episode:
it `yield`s the calls it needs next (one stage: one call, or several parallel calls), reads their
`.text` when it resumes, and fills in the episode's answer at the end. The driver `rollout` runs
the generators of *all* episodes of a step in lockstep, so every stage goes to the engine as one
batch (3 x tasks x n voting generators in one call), whatever control flow each episode follows.
A call made with `is_answer=True` answers the task: `rollout` grades it as soon as it is sampled
(every answer of the stage at once), so the workflow reads its `.grade` and `.metrics` when it
resumes. The file reads top-down: the workflows, the driver, credit; then the prompts and parsers
the workflows use, the metrics, and the options (`WorkflowOptions`) last.

A `Call` is one model call (role instance name such as `generator0`, turn, prompt messages and
ids, completion); an `Episode` is one run of the workflow on one task. GRPO then trains on the
calls (grpo.py). Metrics are kept as numerators and denominators (`episode_tallies`), so batches
and ranks add up exactly.

    python -m pytest tests/test_workflows.py   # every workflow's control flow, a scripted engine
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterator

from infra.roles import role_type
from infra.settings import setting
from infra.tallies import Tallies, add_mean
from tasks import Task, grade_many


@dataclass
class Call:
    name: str                  # role instance: generator0, aggregator ... (its `role`: generator)
    turn: int                  # position in an iterative workflow (Eval-Opt attempt index), else 0
    messages: list[dict]       # the chat messages of the prompt
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    text: str = ""
    truncated: bool = False    # hit the generation length limit
    adapter: str = ""          # filled by the driver from the policy (SP/IP)
    reward: float = 0.0        # credit this call trains on
    grade: float | None = None  # own reward in [0, 1]: an answer's grade, an aggregator's pick's
    metrics: dict = field(default_factory=dict)  # parsed answer, own correctness, format ...
    group: str = ""            # GRPO group when not (name, turn) (Eval-Opt: its attempts share one)
    is_answer: bool = False    # its text answers the task: `rollout` grades it once it is sampled
    sample_logprobs: list[float] | None = None  # the engine's log-prob of each token (vLLM: drift)

    @property
    def role(self) -> str:
        return role_type(self.name)

    @property
    def own_reward(self) -> float | None:
        """Its own reward, where it has one: its grade (an answer's; the aggregator's, its pick's),
        else its correctness (the evaluator's verdict)."""
        if self.grade is None and "correct" in self.metrics:
            return float(self.metrics["correct"])
        return self.grade


@dataclass
class Episode:
    task: Task
    sample: int                # which of the n samples of this task
    calls: list[Call] = field(default_factory=list)
    final_answer: str | None = None
    reward: float = 0.0        # its final answer's grade, in [0, 1]: outcome credit
    metrics: dict = field(default_factory=dict)

    @property
    def correct(self) -> bool:  # full marks: accuracy, success and pass@k count this
        return self.reward >= 1


# ---------------------------------------------------------------- workflows

WorkflowRun = Iterator[list[Call]]  # one episode's workflow, running: each next() is its next stage


def single_agent(ep: Episode, opts: WorkflowOptions) -> WorkflowRun:
    """One `generator` call; its answer is the episode's answer."""
    call = Call("generator", 0, solver_messages(ep.task, opts), is_answer=True)
    yield [call]  # back sampled and, an answer, graded by `rollout`: its .text and .metrics
    ep.final_answer, ep.reward = call.metrics["parsed"], call.grade


def voting(ep: Episode, opts: WorkflowOptions) -> WorkflowRun:
    """`n_votes` generators in parallel (each instance its own name, so its own GRPO group), then an
    aggregator that picks one; the pick's answer is final (the aggregator's text is not graded)."""
    gens = [Call(f"generator{i}", 0, solver_messages(ep.task, opts), is_answer=True)
            for i in range(opts.n_votes)]
    yield gens  # back sampled and graded (`rollout`): each one's .grade and metrics["parsed"]
    agg = Call("aggregator", 0, aggregator_messages(ep.task, [c.text for c in gens], opts))
    yield [agg]
    pick, how = parse_selection(agg.text, len(gens))
    ep.final_answer, ep.reward = gens[pick].metrics["parsed"], gens[pick].grade
    agg.grade = ep.reward  # its own reward is its pick's
    agg.metrics.update(pick=pick, parse=how, formatted=how == "boxed", correct=ep.correct)
    ep.metrics.update(any_correct=any(c.metrics["correct"] for c in gens),
                      fallback=how if how != "boxed" else None)


def evaluator_optimizer(ep: Episode, opts: WorkflowOptions) -> WorkflowRun:
    """generator -> evaluator -> (refine -> evaluator)... until a Correct verdict or
    `max_iterations` evaluator calls (`paper_iterations` when not given). The final answer is the
    last attempt. Every generator call of a task shares one GRPO group (as in the reference), and so
    does every evaluator call. `history` is the reference's shared conversation: attempts and
    critiques as assistant turns, no instructions after the first."""
    budget = opts.max_iterations or paper_iterations(ep.task)
    first = solver_messages(ep.task, opts)
    attempt = Call("generator", 0, first, group="generator", is_answer=True)
    history = list(attempt.messages)
    for it in range(budget):
        yield [attempt]
        history.append(assistant(attempt.text))
        judge = Call("evaluator", it, evaluator_messages(ep.task, attempt.text, history, opts),
                     group="evaluator")
        yield [judge]
        history.append(assistant(judge.text))
        verdict = parse_verdict(judge.text)  # unparseable: not satisfied, and not a correct call
        judge.metrics.update(verdict=verdict, formatted=verdict is not None,
                             correct=verdict is not None and verdict == attempt.metrics["correct"])
        if verdict is True or it == budget - 1:
            break
        feedback = re.sub(r"\\boxed\{[^{}]*\}", "", judge.text)
        retry = refine_messages(ep.task, opts, attempt.text, feedback, history)
        attempt = Call("generator", it + 1, retry, group="generator", is_answer=True)
    attempts = [c for c in ep.calls if c.role == "generator"]
    judges = [c for c in ep.calls if c.role == "evaluator"]
    ep.final_answer, ep.reward = attempts[-1].metrics["parsed"], attempts[-1].grade
    ep.metrics.update(iterations=len(attempts), first_correct=attempts[0].metrics["correct"],
                      unparseable_verdicts=sum(c.metrics["verdict"] is None for c in judges))


def paper_iterations(task: Task) -> int:
    """Eval-Opt's evaluator calls at most when --max-iterations is not given: the paper's, 3 for
    math and 2 for code."""
    return 2 if task.kind == "code" else 3


def orchestrator_workers(ep: Episode, opts: WorkflowOptions) -> WorkflowRun:
    """orchestrator proposes strategies (without solving) -> one `worker` per strategy, in parallel,
    all in one GRPO group -> synthesizer compares them and writes the final answer, which is
    graded."""
    orch = Call("orchestrator", 0, orchestrator_messages(ep.task, opts.max_subtasks))
    yield [orch]
    strategies, how = parse_strategies(orch.text, opts.max_subtasks)
    orch.metrics.update(parse=how, formatted=how == "strategy", strategies=len(strategies))
    workers = [Call("worker", 0, solver_messages(ep.task, opts, s), is_answer=True)
               for s in strategies]
    yield workers
    synthesis = synthesizer_messages(ep.task, [w.text for w in workers], strategies, opts)
    synth = Call("synthesizer", 0, synthesis, is_answer=True)
    yield [synth]
    ep.final_answer, ep.reward = synth.metrics["parsed"], synth.grade
    ep.metrics.update(strategies=len(strategies), fallback=how if how != "strategy" else None)


WORKFLOWS: dict[str, Callable[[Episode, WorkflowOptions], WorkflowRun]] = {
    "single": single_agent,
    "voting": voting,
    "evalopt": evaluator_optimizer,
    "orchworkers": orchestrator_workers,
}
ROLES = {  # role types of each workflow: the adapters IP creates
    "single": ["generator"],
    "voting": ["generator", "aggregator"],
    "evalopt": ["generator", "evaluator"],
    "orchworkers": ["orchestrator", "worker", "synthesizer"],
}


# ---------------------------------------------------------------- the driver

def rollout(tasks: list[Task], n: int, opts: WorkflowOptions, engine,
            encode: Callable[[list[dict]], list[int]], route: Callable[[str], str],
            desc: str = "rollout") -> list[Episode]:
    """Run `n` episodes of `opts.workflow` per task, stage by stage, all pending calls in one
    engine call, then give each call its reward under `opts.credit` (`assign_rewards`): the
    rollout that training, validation and evaluation all run.

    The caller passes the model side in: `encode(messages)` gives a prompt's token ids (the chat
    template), `route(call name)` the adapter a call samples with (SP / IP, or one adapter for
    every role in evaluation). Each stage: the next calls of every running episode, their prompts,
    episodes ended by an over-long prompt, one batched generation, then every answer of the stage
    graded at once, here.
    """
    episodes = [Episode(task, k) for task in tasks for k in range(n)]
    running = [(ep, WORKFLOWS[opts.workflow](ep, opts)) for ep in episodes]
    stage_no = 0
    while running:
        pending = []  # (episode, its workflow run, the calls of its next stage)
        for ep, workflow_run in running:
            calls = next(workflow_run, None)  # None: the episode's workflow has returned
            if calls is not None:
                pending.append((ep, workflow_run, calls))
        encode_prompts([c for _, _, cs in pending for c in cs], encode, route)
        pending = [(ep, workflow_run, cs) for ep, workflow_run, cs in pending
                   if not end_if_overlong(ep, workflow_run, cs, opts.max_prompt_tokens)]
        calls = [c for _, _, cs in pending for c in cs]
        if not calls:
            break
        stage_no += 1
        generations = engine.generate([c.prompt_ids for c in calls], [c.adapter for c in calls],
                                      desc=f"{desc} stage {stage_no}")
        for c, g in zip(calls, generations):
            c.completion_ids, c.text, c.truncated = g.completion_ids, g.text, g.truncated
            c.sample_logprobs = g.logprobs
        # grade every answer of the stage at once (code runs in parallel sandboxes): the workflows
        # read each answer's own grade when they resume, before any credit is broadcast
        answers = [(ep.task, c) for ep, _, cs in pending for c in cs if c.is_answer]
        grades = grade_many([task for task, _ in answers], [c.text for _, c in answers])
        for (_, c), g in zip(answers, grades):
            c.grade = g.reward  # what credit gives it; correct: full marks
            c.metrics.update(parsed=g.parsed, correct=g.reward >= 1, formatted=g.formatted,
                             reason=g.reason)
        for ep, _, cs in pending:
            ep.calls += cs
        running = [(ep, workflow_run) for ep, workflow_run, _ in pending]
    assign_rewards(episodes, opts.credit)
    return episodes


def encode_prompts(calls: list[Call], encode: Callable[[list[dict]], list[int]],
                   route: Callable[[str], str]) -> None:
    """Each call's adapter and prompt ids; a task's n episodes often send the same messages:
    templated once."""
    templated: dict[tuple, list[int]] = {}
    for c in calls:
        c.adapter = route(c.name)
        key = tuple((m["role"], m["content"]) for m in c.messages)
        if key not in templated:
            templated[key] = encode(c.messages)
        c.prompt_ids = list(templated[key])


def end_if_overlong(ep: Episode, workflow_run: WorkflowRun, calls: list[Call],
                    max_prompt_tokens: int | None) -> bool:
    """As the reference: a prompt over the limit is never truncated; it ends its episode before the
    call. The calls made so far are kept and trained on, each with its own reward
    (`assign_rewards`); the episode's reward is the best of theirs, so it counts as correct if one
    of them was (the reference: any kept reward > 0). Counted as `prompt_overflow`."""
    if not max_prompt_tokens or all(len(c.prompt_ids) <= max_prompt_tokens for c in calls):
        return False
    workflow_run.close()
    ep.metrics["prompt_overflow"] = True
    ep.final_answer, ep.reward = None, max((c.own_reward or 0.0 for c in ep.calls), default=0.0)
    return True


# ---------------------------------------------------------------- credit

def assign_rewards(episodes: list[Episode], credit: str) -> None:
    """Set each call's reward. `outcome`: the episode's reward, its final answer's grade, broadcast
    to every call (paper default). `role`: each call its own reward where it has one
    (`Call.own_reward`: an answer its grade, the aggregator its pick's, the evaluator its verdict's
    correctness), else the outcome. An episode ended by an over-long prompt has no final outcome:
    its calls keep their own rewards (0 where none)."""
    if credit not in ("outcome", "role"):
        raise ValueError(f"unknown credit {credit!r} (expected outcome or role)")
    for ep in episodes:
        for c in ep.calls:
            own = c.own_reward
            if ep.metrics.get("prompt_overflow"):
                c.reward = own or 0.0
            else:
                c.reward = ep.reward if credit == "outcome" or own is None else own


# ---------------------------------------------------------------- prompts
# Our own words for what each reference prompt asks (method notes, "Prompts"), in two styles.
# `paper`: solve step by step, analyse every solution before selecting. `small`, the CPU default:
# what SmolLM2-135M can follow within 64 new tokens, brief reasoning and a bare selection, after one
# solved example (math).

SOLVE = {
    ("paper", "math"): "Solve the problem step by step, showing your work, then give the final "
                       "answer in \\boxed{}.",
    ("paper", "code"): "Solve the programming problem step by step: reason about the algorithm "
                       "and the edge cases, then give the complete program in one ```python code "
                       "block.",
    ("small", "math"): "Solve the problem. Show brief reasoning, then give the final answer in "
                       "\\boxed{}.",
    ("small", "code"): "Solve the programming task in Python. Reason briefly, then give the "
                       "complete program in one ```python code block.",
}
ONE_SHOT = [  # `small`, math only: SmolLM2-135M boxes its answer only after one boxed example
    {"role": "user", "content": f"{SOLVE['small', 'math']}\n\nProblem: What is 23 + 45?"},
    {"role": "assistant", "content": "23 + 45 = 68.\n\n\\boxed{68}"},
]
ANSWER_FORMAT = {  # the one phrase in which math and code prompts differ
    "math": "give the final answer in \\boxed{}",
    "code": "give the complete program in one ```python code block",
}
REVIEW = {
    "math": "Review the solution above for correctness: check its reasoning and its final answer.",
    "code": "Review the program above for correctness: its logic, its edge cases and its bugs, "
            "without running it and without writing a corrected program.",
}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text.strip()}


def problem_text(task: Task) -> str:
    if task.kind == "code" and task.metadata.get("entry_point"):  # HumanEval: signature, docstring
        return f"Complete this Python function (keep its signature and imports):\n\n{task.question}"
    return f"Problem: {task.question}"


def solver_messages(task: Task, opts: WorkflowOptions, strategy: str | None = None) -> list[dict]:
    """The prompt of a role that solves the task from scratch (single agent, generators,
    workers)."""
    shot = ONE_SHOT if opts.prompts == "small" and task.kind == "math" else []
    hint = ""
    if strategy:
        hint = ("\n\nUse this strategy as your main approach, and solve the whole problem: "
                f"{strategy}")
    return shot + [user(f"{SOLVE[opts.prompts, task.kind]}\n\n{problem_text(task)}{hint}")]


def solutions_block(texts: list[str], strategies: list[str] | None = None) -> str:
    """The candidates, numbered; with `strategies`, each labelled with its worker's strategy, as the
    reference's synthesizer sees them."""
    labels = [f" (Strategy: {s})" for s in strategies] if strategies else [""] * len(texts)
    return "\n\n".join(f"--- Solution {i}{label} ---\n{t.strip()}"
                       for i, (t, label) in enumerate(zip(texts, labels), 1))


def aggregator_messages(task: Task, candidates: list[str], opts: WorkflowOptions) -> list[dict]:
    n = len(candidates)
    if opts.prompts == "paper":
        ask = (f"Review them: analyse each for correctness and completeness, check its reasoning "
               f"and its final answer, then select the one most likely to be correct. End with its "
               f"number (1 to {n}) in \\boxed{{}}.")
    else:
        ask = (f"Which solution is correct? Compare their answers and reasoning, then give only "
               f"the number of the best solution (1 to {n}) in \\boxed{{}}, for example "
               f"\\boxed{{1}}.")
    block = solutions_block(candidates)
    return [user(f"{problem_text(task)}\n\nHere are {n} candidate solutions.\n\n{block}\n\n{ask}")]


def evaluator_messages(task: Task, attempt: str, history: list[dict], opts: WorkflowOptions
                       ) -> list[dict]:
    """reference: the conversation so far, then an instruction about "the solution above". clean:
    the problem and the latest attempt only."""
    verdict = ("Do not reveal the correct answer. Give brief feedback, then end with "
               "\\boxed{Correct} or \\boxed{Incorrect}.")
    if opts.evalopt_context == "reference":
        ask = f"If it is incorrect, say briefly what the main problem is. {verdict}"
        return history + [user(f"{REVIEW[task.kind]} {ask}")]
    if task.kind == "code":
        what = ("Check the logic of this program without running it; do not write a corrected "
                "program.")
    else:
        what = "Check whether this solution and its final answer are correct."
    solution = f"Proposed solution:\n{attempt.strip()}"
    return [user(f"{problem_text(task)}\n\n{solution}\n\n{what} {verdict}")]


def refine_messages(task: Task, opts: WorkflowOptions, attempt: str, feedback: str,
                    history: list[dict]) -> list[dict]:
    """The generator's retry. reference: the conversation so far (attempts and critiques), then an
    instruction to write a new solution from the feedback above. clean: its own last attempt, then
    the feedback."""
    answer = ANSWER_FORMAT[task.kind]
    if opts.evalopt_context == "reference":
        if task.kind == "code":  # the reference's: another approach only if the logic was wrong
            return history + [user(
                f"Write an improved solution based on the review above. Address the issues it "
                f"raises, use a different approach if the previous logic was fundamentally "
                f"flawed, handle all edge cases, and {answer}.")]
        return history + [user(
            f"Write a new solution based on the feedback above, with a completely different "
            f"method. Address the issues it raises, and {answer}.")]
    return solver_messages(task, opts) + [
        assistant(attempt),
        user(f"A reviewer judged your solution incorrect. Feedback:\n{feedback.strip()}\n\n"
             f"Solve the problem again with a different approach, and {answer}."),
    ]


def orchestrator_messages(task: Task, max_subtasks: int) -> list[dict]:
    return [user(f"{problem_text(task)}\n\nDo not solve the problem. Propose at most "
                 f"{max_subtasks} distinct strategies for it, each a different technique, "
                 f"described briefly, one per line, written as\nSTRATEGY 1: ...\nSTRATEGY 2: ...")]


def synthesizer_messages(task: Task, solutions: list[str], strategies: list[str],
                         opts: WorkflowOptions) -> list[dict]:
    """paper prompts: each solution labelled with its strategy, as the reference; small: the bare
    solutions."""
    labels = strategies if opts.prompts == "paper" else None
    return [user(f"{problem_text(task)}\n\nWorkers solved it with different strategies.\n\n"
                 f"{solutions_block(solutions, labels)}\n\nRead each solution and check its "
                 f"reasoning. Answers that agree deserve more confidence. Decide on the final "
                 f"answer and {ANSWER_FORMAT[task.kind]}.")]


# ---------------------------------------------------------------- parsing (the reference's parsers)

_BOXED_INT = re.compile(r"\\boxed\{(\d+)\}")
_DIGIT = re.compile(r"\b([1-9])\b")
_VERDICT = re.compile(r"\\boxed\{(Correct|Incorrect)\}", re.IGNORECASE)


def parse_selection(text: str, n: int) -> tuple[int, str]:
    """Aggregator's pick, 0-based, and the parser path that found it, as the reference parses: the
    first \\boxed{<int>} if in range (`boxed`); else the first standalone digit 1-9 if in range
    (`digit`); else candidate 1 (`default`). Only the first match of each is looked at."""
    for pattern, how in ((_BOXED_INT, "boxed"), (_DIGIT, "digit")):
        m = pattern.search(text)
        if m and 1 <= int(m.group(1)) <= n:
            return int(m.group(1)) - 1, how
    return 0, "default"


def parse_verdict(text: str) -> bool | None:
    """Evaluator's verdict, the first \\boxed{Correct} or \\boxed{Incorrect} (any case): True,
    False, or None (unparseable: the loop goes on, and the evaluator call counts as wrong)."""
    m = _VERDICT.search(text)
    return None if m is None else m.group(1).lower() == "correct"


_STRATEGY = re.compile(r"^\s*\**\s*strategy\s*\d+\s*\**\s*[:.)-]\s*\**\s*(.+)$", re.I | re.M)
_NUMBERED = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+(.+)$", re.M)


def parse_strategies(text: str, k: int) -> tuple[list[str], str]:
    """Up to k distinct strategies and the parser that found them: `strategy` lines, a `numbered`
    list, non-empty `lines`, or the `whole` text as one strategy."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for kind, found in (("strategy", _STRATEGY.findall(text)),
                        ("numbered", _NUMBERED.findall(text)),
                        ("lines", lines)):
        unique = list(dict.fromkeys(s.strip() for s in found if s.strip()))
        if unique:
            return unique[:k], kind
    return [text.strip() or "Solve the problem directly."], "whole"


# ---------------------------------------------------------------- metrics

# each parser's paths, the first the format asked for: the others are fallbacks
PARSE_PATHS = (("boxed", "digit", "default"), ("strategy", "numbered", "lines", "whole"))


def episode_tallies(episodes: list[Episode]) -> Tallies:
    """Every episode metric as a numerator and a denominator (infra/tallies.py), so that metrics of
    several batches (the ranks of a torchrun launch) combine by adding, never by averaging averages.
    `rates` turns them into metrics."""
    t: Tallies = {}
    for e in episodes:
        add_mean(t, "success", e.correct)
        add_mean(t, "prompt_overflow", "prompt_overflow" in e.metrics)
        for c in e.calls:
            add_mean(t, f"{c.role}/response_len", len(c.completion_ids))
            add_mean(t, f"{c.role}/truncated", c.truncated)
            for key, name in (("correct", "acc"), ("formatted", "format_ok")):
                if key in c.metrics:
                    add_mean(t, f"{c.role}/{name}", c.metrics[key])
            for paths in PARSE_PATHS:  # parser fallbacks taken (finding 5)
                if c.metrics.get("parse") in paths:
                    for how in paths[1:]:
                        add_mean(t, f"{c.role}/fallback_{how}", c.metrics["parse"] == how)
        _workflow_tallies(e, t)
    for outcomes in task_outcomes(episodes).values():  # a task's samples all sit on one rank
        add_mean(t, "solve_none", not any(outcomes))
        add_mean(t, "solve_all", all(outcomes))
        add_mean(t, "solve_partial", 0 < sum(outcomes) < len(outcomes))
    return t


def task_outcomes(episodes: list[Episode]) -> dict[str, list[bool]]:
    """Each task's episodes' correctness, in order: task id -> [correct, ...]."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    for e in episodes:
        per_task[e.task.id].append(e.correct)
    return per_task


def _workflow_tallies(e: Episode, t: Tallies) -> None:
    """The statistics each workflow's findings are read from (method notes, findings 1-2)."""
    if "any_correct" in e.metrics:  # Voting: could a perfect aggregator have been right? (pass@N)
        add_mean(t, "any_correct", e.metrics["any_correct"])
    if "iterations" in e.metrics:  # Eval-Opt: when is a retry asked for, and does it help?
        retried, first = e.metrics["iterations"] > 1, e.metrics["first_correct"]
        for key in ("p_retry_first_wrong", "p_retry_first_right", "fix_rate", "break_rate"):
            t.setdefault(key, [0.0, 0.0])  # defined even when it has nothing to count (then null)
        add_mean(t, "retry_rate", retried)
        add_mean(t, "first_attempt_acc", first)  # the first attempt (generator/acc: every attempt)
        add_mean(t, "p_retry_first_right" if first else "p_retry_first_wrong", retried)
        add_mean(t, "break_rate" if first else "fix_rate", e.correct != first)  # right<->wrong
        add_mean(t, "mean_iterations", e.metrics["iterations"])
        add_mean(t, "unparseable_verdicts", e.metrics["unparseable_verdicts"])
    if "strategies" in e.metrics:  # Orch-Workers: strategies parsed, how often a worker was right
        add_mean(t, "strategies", e.metrics["strategies"])
        for c in e.calls:
            if c.role == "worker":
                add_mean(t, "worker_success_rate", c.metrics["correct"])
    if "fallback" in e.metrics:
        add_mean(t, "fallback_rate", e.metrics["fallback"] is not None)


# ---------------------------------------------------------------- options

@dataclass
class WorkflowOptions:
    """Which workflow, its credit, and what shapes its prompts and control flow: what `rollout`
    takes. Each field is one flag of train.py, made with `setting` as grpo.UpdateSettings's are:
    its default, its flag, its help, the paper's value and the values it takes."""
    workflow: str = setting("single", "--workflow", "its roles: " + "; ".join(
        f"{w} {'/'.join(r)}" for w, r in ROLES.items()), choices=sorted(WORKFLOWS),
        group="workflow (workflows.WorkflowOptions)")
    credit: str = setting("outcome", "--credit", "outcome: the final answer's reward to every call "
                          "(paper); role: each call its own", choices=["outcome", "role"])
    prompts: str = setting("small", "--prompts", "paper: the reference's instructions in our "
        "words; small: brief ones and a solved example", choices=["small", "paper"], paper="paper")
    evalopt_context: str = setting("reference", "--evalopt-context", "Eval-Opt: one shared "
        "conversation (reference); clean: the problem and the latest attempt only",
        choices=["reference", "clean"], paper="reference")
    n_votes: int = setting(3, "--n-votes", "Voting: parallel generators", within="[1, inf)",
                           paper=3)
    max_iterations: int | None = setting(None, "--max-iterations", "Eval-Opt: evaluator calls at "
        "most; not given: the paper's for the task (paper_iterations)", within="[1, inf)",
        paper="math 3, code 2")
    max_subtasks: int = setting(3, "--max-subtasks", "Orch-Workers: strategies, hence workers, "
                                "at most", within="[1, inf)", paper=3)
    max_prompt_tokens: int = setting(4096, "--max-prompt-tokens", "a longer prompt ends its "
        "episode, as in the paper (prompt_overflow)", within="[1, inf)")
