"""Workflows: the roles, their prompts, the control flow between them, and credit.

Paper: "Workflows (reference control flow)" and "Rewards and credit" in ../shared/PAPER.md.

A workflow is written as a plain Python generator per episode: it `yield`s the
calls it needs next (one stage: one call, or several parallel calls), reads their
`.text` when it resumes, and fills in the episode's answer at the end. The driver
`rollout` runs the generators of *all* episodes of a step in lockstep, so every
stage goes to the engine as one batch (3 x tasks x n voting generators in one
call), whatever control flow each episode is following.

Records: a `Call` is one model call (role instance name such as `generator0`, its
role type and adapter, the turn, the prompt messages and ids, the completion);
an `Episode` is one run of the workflow on one task (its calls, final answer,
correctness). GRPO then trains on the calls (grpo.py).

    python -c "import workflows; print(workflows.solver_messages(...))"
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterator

from policies import chat_prompt_ids, route_adapter
from tasks import Task, grade

# ---------------------------------------------------------------- records


@dataclass
class Call:
    name: str                  # role instance: generator0, aggregator, worker ...
    turn: int                  # position in an iterative workflow (Eval-Opt attempt index), else 0
    messages: list[dict]       # the chat messages of the prompt
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    text: str = ""
    truncated: bool = False    # hit the generation length limit
    adapter: str = ""          # filled by the driver from the policy (SP/IP)
    reward: float = 0.0        # credit this call trains on
    advantage: float = 0.0
    metrics: dict = field(default_factory=dict)  # parsed answer, own correctness, format compliance ...

    @property
    def role(self) -> str:
        """Role type: instance digits stripped (generator0 -> generator)."""
        return re.sub(r"\d+$", "", self.name)

    def group_key(self, task_id: str) -> tuple:
        """GRPO group: calls with the same key are compared with each other (PAPER: task, name, turn)."""
        return (task_id, self.name, self.turn)


@dataclass
class Episode:
    task: Task
    sample: int                # which of the n samples of this task
    calls: list[Call] = field(default_factory=list)
    final_answer: str | None = None
    correct: bool = False
    metrics: dict = field(default_factory=dict)


@dataclass
class WorkflowOptions:
    """What shapes the prompts (train.py fills it from flags)."""
    one_shot: bool = True       # prepend a solved example: small models (SmolLM2) only box answers with one


# ---------------------------------------------------------------- prompts

MATH_INSTRUCTION = "Solve the problem. Show brief reasoning, then give the final answer in \\boxed{}."
ONE_SHOT = [
    {"role": "user", "content": f"{MATH_INSTRUCTION}\n\nProblem: What is 23 + 45?"},
    {"role": "assistant", "content": "23 + 45 = 68.\n\n\\boxed{68}"},
]


def solver_messages(task: Task, opts: WorkflowOptions) -> list[dict]:
    """The prompt of a role that solves the task from scratch (single agent, generators, workers)."""
    shot = ONE_SHOT if opts.one_shot else []
    return shot + [{"role": "user", "content": f"{MATH_INSTRUCTION}\n\nProblem: {task.question}"}]


# ---------------------------------------------------------------- workflows

Stage = Iterator[list[Call]]


def single_agent(ep: Episode, opts: WorkflowOptions) -> Stage:
    """One `generator` call; its answer is the episode's answer."""
    call = Call("generator", 0, solver_messages(ep.task, opts))
    yield [call]
    ep.calls.append(call)
    g = grade_call(ep.task, call)
    ep.final_answer, ep.correct = g.parsed, g.reward > 0


def grade_call(task: Task, call: Call):
    """Grade a call's own answer and keep what was parsed in its metrics (role accuracy, format compliance)."""
    g = grade(task, call.text)
    call.metrics.update(parsed=g.parsed, correct=g.reward > 0, formatted=g.formatted, reason=g.reason)
    return g


WORKFLOWS: dict[str, Callable[[Episode, WorkflowOptions], Stage]] = {
    "single": single_agent,
}


# ---------------------------------------------------------------- driver

def rollout(tasks: list[Task], n: int, workflow: str, engine, tokenizer, policy: str, opts: WorkflowOptions,
            enable_thinking: bool = False, adapter_override: str | None = None) -> list[Episode]:
    """Run `n` episodes of `workflow` per task, stage by stage, all pending calls in one engine call.

    `adapter_override` routes every call to one adapter (None keeps SP/IP routing);
    pass `"__base__"` for the base model.
    """
    if workflow not in WORKFLOWS:
        raise ValueError(f"unknown workflow {workflow!r}; expected one of {sorted(WORKFLOWS)}")
    episodes = [Episode(task, k) for task in tasks for k in range(n)]
    running = [WORKFLOWS[workflow](ep, opts) for ep in episodes]
    while running:
        pending: list[tuple[Stage, list[Call]]] = []
        for stage in running:
            try:
                pending.append((stage, next(stage)))
            except StopIteration:
                pass
        calls = [c for _, cs in pending for c in cs]
        if not calls:
            break
        for c in calls:
            c.adapter = adapter_override or route_adapter(c.name, policy)
            c.prompt_ids = chat_prompt_ids(tokenizer, c.messages, enable_thinking)
        for c, g in zip(calls, engine.generate([c.prompt_ids for c in calls], [c.adapter for c in calls])):
            c.completion_ids, c.text, c.truncated = g.completion_ids, g.text, g.truncated
        running = [stage for stage, _ in pending]
    return episodes


# ---------------------------------------------------------------- credit

def assign_rewards(episodes: list[Episode], credit: str = "outcome") -> None:
    """Set each call's reward. `outcome`: the episode's final correctness broadcast to every call (paper default).
    `role`: each call its own correctness where it has one (`metrics['correct']`), else the outcome."""
    for ep in episodes:
        outcome = float(ep.correct)
        for c in ep.calls:
            if credit == "outcome":
                c.reward = outcome
            elif credit == "role":
                c.reward = float(c.metrics.get("correct", ep.correct))
            else:
                raise ValueError(f"unknown credit {credit!r} (expected outcome or role)")


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Accuracy, per-role accuracy/length/format/truncation, and solve_none/all/partial over each task's samples."""
    m: dict[str, float] = {"success": sum(e.correct for e in episodes) / max(len(episodes), 1)}
    by_role: dict[str, list[Call]] = {}
    for e in episodes:
        for c in e.calls:
            by_role.setdefault(c.role, []).append(c)
    for role, calls in by_role.items():
        m[f"{role}/count"] = len(calls)
        m[f"{role}/response_len"] = sum(len(c.completion_ids) for c in calls) / len(calls)
        m[f"{role}/truncated"] = sum(c.truncated for c in calls) / len(calls)
        graded = [c for c in calls if "correct" in c.metrics]
        if graded:
            m[f"{role}/acc"] = sum(c.metrics["correct"] for c in graded) / len(graded)
        fmt = [c for c in calls if "formatted" in c.metrics]
        if fmt:
            m[f"{role}/format_ok"] = sum(c.metrics["formatted"] for c in fmt) / len(fmt)
    per_task: dict[str, list[bool]] = {}
    for e in episodes:
        per_task.setdefault(e.task.id, []).append(e.correct)
    solved = [sum(v) for v in per_task.values()]
    sizes = [len(v) for v in per_task.values()]
    m["solve_none"] = sum(s == 0 for s in solved) / len(solved)
    m["solve_all"] = sum(s == k for s, k in zip(solved, sizes)) / len(solved)
    m["solve_partial"] = 1 - m["solve_none"] - m["solve_all"]
    return m
