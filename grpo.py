"""GRPO for every role of a workflow: group advantages, the clipped loss, the per-adapter update.

The method notes, docs/method.md ("GRPO as trained", "SP and IP"), describe what is trained. The
one idea to take away: every aggregation mode is a *per-token weight*. `token_weights` says how
much each token of a mini-batch counts in the loss, and the loss is sum(weight * token_loss). That
makes three things exact and visible: micro-batching is plain gradient accumulation; a role's share
of the loss under SP is the sum of its tokens' weights (finding 3); re-weighting roles is
multiplying their tokens' weights.

grpo.py never branches on the policy (SP/IP): the adapter name on each row carries it
(`policies.route_adapter`). Under SP one `shared` adapter holds every role's rows; under IP each
role type's adapter holds its own, so a role with three instances takes three optimizer steps per
training step (finding 4).

`update_policy` is the update on one page: per adapter, mini-batches; per mini-batch, zero_grad,
micro-batches (`micro_batch_loss`: each term of its loss line computed there or in a function it
calls; backward), clip, step. `UpdateSettings` holds every knob of advantages, loss and optimizer,
and `policy_problem` the settings SP or IP rules out. What the update reports goes through one
seam, `UpdateReport` (infra/update_report.py: per-role statistics, each role's own gradient under
SP, I6's scale), which changes no number. Under torchrun, infra/distributed.py gives every rank
the global batch's rows to cut into the same mini-batches, marks the rows each rank trains and
sums the gradients; one process takes the other branch and never meets ranks. Metrics are counted
as numerator and denominator (infra/tallies.py) and turned into rates once, at the end.

    python -m pytest tests/test_grpo.py      # hand-computed checks of everything here
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Hashable

import torch
from tqdm import tqdm

from infra import distributed
from infra.update_report import UpdateReport, flat_grad
from policies import (
    adapter_parameters,
    completion_logprobs,
    micro_batches,
    policy_logprobs,
    use_adapter,
)

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                "seq-mean-token-sum-norm")


# ---------------------------------------------------------------- rows and settings

@dataclass
class Row:
    """One call, as the update sees it: one training row."""
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float
    role: str      # role type for metrics: generator0 -> generator
    adapter: str   # the adapter this call trains: SP `shared`, IP its role (route_adapter)


@dataclass
class UpdateSettings:
    """GRPO's knobs: advantages, the loss, the optimizer. Each field with a `help` is one flag of
    train.py, made from it by infra/flags.py: its flag, default, help, the paper's value (`paper`)
    and the values it takes (`within`, `choices`). A 0 that stands for a computed value, and a
    field without `help`, are given by train.py's `settings_from_flags`. A new knob is one field
    here, read as `cfg.<name>` where the update uses it."""
    std_scale: bool = field(default=True, metadata=dict(
        flag="--std-scale", group="GRPO (grpo.UpdateSettings)",
        help="advantage = (r - mean) / std; --no-std-scale: r - mean (Dr. GRPO)", paper=True))
    mini_batch_size: int = field(default=0, metadata=dict(
        flag="--mini-batch-size", help="rows per optimizer step; 0 = a step's episodes",
        within="[0, inf)", paper=512))
    micro_batch_size: int = field(default=8, metadata=dict(
        flag="--micro-batch-size", within="[1, inf)",
        help="rows per forward/backward at most (memory only: the gradient is the same)"))
    max_tokens_per_micro_batch: int = field(default=0, metadata=dict(  # verl: dynamic bsz
        flag="--max-tokens-per-micro-batch", within="[0, inf)", paper=51200,
        help="padded tokens per forward/backward at most; 0 = rows only"))
    agg: str = field(default="seq-mean-token-mean", metadata=dict(
        flag="--agg", help="loss aggregation: how much each token counts (grpo.token_weights)",
        choices=AGGREGATIONS, paper="seq-mean-token-mean"))
    norm_len: int | None = None  # seq-mean-token-sum-norm's length: train.py's --max-new-tokens
    clip_low: float = field(default=0.2, metadata=dict(
        flag="--clip-low", help="PPO clip below 1", within="(0, 1)", paper=0.2))
    clip_high: float = field(default=0.28, metadata=dict(
        flag="--clip-high", help="PPO clip above 1 (clip-higher)", within="(0, inf)", paper=0.28))
    dual_clip: float = field(default=3.0, metadata=dict(
        flag="--dual-clip", within="(1, inf)", paper=3,
        help="dual-clip constant: a negative advantage's loss is capped at -A x this"))
    temperature: float = field(default=0.7, metadata=dict(
        flag="--temperature", within="[0, inf)", paper=0.7,
        help="sampling temperature; the update takes its log-probs at it too"))
    role_weights: dict[str, float] = field(default_factory=dict, metadata=dict(
        flag="--role-weights", within="[0, inf)",
        help="SP: loss share per role, 'equal' or generator=2,aggregator=1; none: the "
             "aggregation's own shares (as the paper)"))
    merge_instance_steps: bool = field(default=False, metadata=dict(
        flag="--merge-instance-steps", paper=False,
        help="finding 4: one optimizer step per adapter per training step, not one per mini-batch"))
    kl_coef: dict[str, float] = field(default_factory=dict, metadata=dict(
        flag="--kl-coef", within="(0, inf)",
        help="I1: role=beta,... adds beta * KL(role || base) (k3)"))
    coherence: dict[str, float] = field(default_factory=dict, metadata=dict(
        flag="--coherence", within="(0, 1]", paper="<= 0.3",
        help="I6 (IP): role=lambda,... lambda in (0, 1]"))
    coherence_window: int = field(default=128, metadata=dict(
        flag="--coherence-window", help="I6: EMA window, tau = 1 - 1/window", within="[1, inf)",
        paper=128))
    share_prompts: bool = field(default=True, metadata=dict(  # policies.shared_prompt_cache
        flag="--share-prompts", help="rows that share a prompt run it once "
        "(--no-share-prompts: each row its whole prompt)"))
    skip_zero_advantage: bool = field(default=False, metadata=dict(
        flag="--skip-zero-advantage", help="skip calls with advantage 0: the same step, less work "
        "(entropy and clip_frac then cover the trained calls)"))
    lr: float = field(default=5e-4, metadata=dict(
        flag="--lr", group="optimisation (grpo.UpdateSettings)", within="(0, inf)",
        help="AdamW learning rate, per adapter", paper="2e-5 at rank 64"))
    weight_decay: float = field(default=0.01, metadata=dict(
        flag="--weight-decay", help="AdamW weight decay", within="[0, inf)", paper=0.01))
    warmup_steps: int = field(default=3, metadata=dict(
        flag="--warmup-steps", help="linear warm-up steps", within="[0, inf)", paper=15))
    lr_schedule: str = field(default="constant", metadata=dict(  # verl-constant: lr_multiplier
        flag="--lr-schedule", choices=["constant", "cosine", "verl-constant"],
        help="after warm-up; cosine: to 0 at the last step (the paper's config); verl-constant: "
             "what its runs did, from lr 0, counting adapter updates (cells)"))
    max_grad_norm: float = field(default=1.0, metadata=dict(
        flag="--max-grad-norm", help="gradient clipping per adapter", within="(0, inf)", paper=1))


def policy_problem(cfg: UpdateSettings, policy: str) -> str | None:
    """What these settings cannot do under `policy` (one line; train.py stops on it before anything
    loads), or None. Role shares are weights inside one shared adapter, so SP only; I6 shrinks a
    role's own adapter's gradient, so IP only."""
    if cfg.role_weights and not any(cfg.role_weights.values()):
        return "--role-weights are all 0: no role would train"
    if cfg.role_weights and policy == "ip":
        return "--role-weights sets shares inside one shared adapter; it needs --policy sp"
    if cfg.coherence and policy == "sp":
        return "--coherence acts on a role's own adapter gradient; it needs --policy ip"
    return None


# ---------------------------------------------------------------- advantages

def group_advantages(rewards: list[float], keys: list[Hashable],
                     scale_by_std: bool = UpdateSettings.std_scale, eps: float = 1e-6
                     ) -> list[float]:
    """Each call's outcome advantage against the other members of its group (task, name, turn).

    Advantage = (r - mean) / (std + eps), unbiased std, or r - mean with `scale_by_std=False`
    (Dr. GRPO): rewards [0, 1] give -0.7071 and +0.7071 (mean 0.5, std 0.7071). A group whose
    rewards are all equal gets 0 for every member (nothing to learn); a group of one has no
    baseline: like verl (the reference), mean 0 and std 1, so its advantage is its raw reward.
    """
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        members[k].append(i)
    adv = [0.0] * len(rewards)
    for idx in members.values():
        r = torch.tensor([float(rewards[i]) for i in idx], dtype=torch.float64)
        mean, std = (r.mean(), r.std()) if len(idx) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        a = (r - mean) / (std + eps) if scale_by_std else r - mean
        for i, v in zip(idx, a.tolist()):
            adv[i] = v
    return adv


# ---------------------------------------------------------------- the loss

def token_weights(lengths: list[int], agg: str, norm_len: int | None = None) -> list[float]:
    """Weight of each token of row i in the mini-batch loss (the same for all its tokens).

    N rows, lengths L_i, T = sum L_i:
      token-mean               1 / T            every token counts the same
      seq-mean-token-mean      1 / (N * L_i)    every row counts the same (paper default)
      seq-mean-token-sum       1 / N            longer rows count more
      seq-mean-token-sum-norm  1 / (N * norm_len)  Dr. GRPO: a constant length (the budget)
    """
    n, total = len(lengths), sum(lengths)
    if agg == "token-mean":
        return [1.0 / total] * n
    if agg == "seq-mean-token-mean":
        return [1.0 / (n * max(L, 1)) for L in lengths]
    if agg == "seq-mean-token-sum":
        return [1.0 / n] * n
    if agg == "seq-mean-token-sum-norm":
        if norm_len is None:
            raise ValueError("seq-mean-token-sum-norm needs norm_len, its constant length")
        return [1.0 / (n * norm_len)] * n
    raise ValueError(f"unknown loss aggregation {agg!r}; expected one of {AGGREGATIONS}")


def clipped_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                       clip_low: float = UpdateSettings.clip_low,
                       clip_high: float = UpdateSettings.clip_high,
                       dual_clip: float = UpdateSettings.dual_clip
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, with clip-higher and dual clip (verl's form).

    logp, old_logp: [B, T]; adv: [B]. Returns (loss [B, T], clipped [B, T] bool). For A > 0 the
    ratio is capped at 1 + clip_high; for A < 0 it is floored at 1 - clip_low, and the loss is
    also capped at -A * dual_clip so a huge ratio on a bad row cannot blow up the step.
    """
    adv = adv[:, None]
    ratio = torch.exp(logp - old_logp)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual = torch.minimum(loss_ppo, -adv * dual_clip)
    loss = torch.where(adv < 0, loss_dual, loss_ppo)
    clipped = (loss_clipped > loss_unclipped) | ((adv < 0) & (loss_ppo > -adv * dual_clip))
    return loss, clipped


# ---------------------------------------------------------------- the optimizers

def lr_multiplier(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """The learning rate of scheduler step `step` (from 0) as a fraction of --lr. constant and
    cosine count training steps: linear warm-up to 1 at step `warmup_steps` - 1, then constant, or
    a half cosine that reaches 0 at training step `total_steps`. verl-constant is what the
    reference's runs executed (docs/method.md): verl's constant schedule with warm-up, which starts
    at 0 (the first update changes nothing) and counts adapter updates (`step_schedules`)."""
    if schedule == "verl-constant":
        return min(step, warmup_steps) / warmup_steps if warmup_steps else 1.0
    n = step + 1  # the training step's number, from 1
    if n <= warmup_steps:
        return n / warmup_steps
    if schedule == "constant":
        return 1.0
    done = min(n - warmup_steps, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * done / max(total_steps - warmup_steps, 1)))


def make_optimizers(model, adapters: list[str], cfg: UpdateSettings,
                    total_steps: int) -> dict[str, tuple]:
    """One AdamW (--lr, --weight-decay) + schedule (`lr_multiplier`: --warmup-steps, --lr-schedule
    over `total_steps` training steps) per adapter: IP roles never share optimizer state. The
    schedules advance in `step_schedules`."""
    out = {}
    for a in adapters:
        opt = torch.optim.AdamW(adapter_parameters(model, a), lr=cfg.lr,
                                weight_decay=cfg.weight_decay)
        out[a] = (opt, torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_multiplier(s, cfg.warmup_steps, total_steps, cfg.lr_schedule)))
    return out


def step_schedules(optimizers: dict, adapter: str, had_rows: bool, schedule: str) -> None:
    """Advance the learning-rate schedules after `adapter`'s part of a training step.

    constant and cosine: the adapter's own schedule, once per training step, rows or not.
    verl-constant: as the reference's runs did, one scheduler that every adapter update with rows
    steps, so all schedules advance after each such update: under IP with K adapters the warm-up
    ends after ceil(warmup_steps / K) training steps, and the second adapter already runs at the
    lr the first one's update moved to.
    """
    if schedule != "verl-constant":
        stepping = [optimizers[adapter][1]]
    else:
        stepping = [sched for _, sched in optimizers.values()] if had_rows else []
    with warnings.catch_warnings():  # a schedule step without an optimizer step is on purpose
        warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler.step\(\)` before",
                                UserWarning)
        for sched in stepping:
            sched.step()


# ---------------------------------------------------------------- rows and mini-batches

def training_rows(episodes: list, scale_by_std: bool = UpdateSettings.std_scale) -> list[Row]:
    """Every call of every episode as one GRPO row: its reward compared within its group
    (`group_advantages`; `Call.group_key`: task, call name and turn, as below, or a group the
    workflow names), its tokens, its role type and the adapter it trains (`Call.adapter`, which
    the rollout set from the policy with policies.route_adapter: the one thing SP and IP change,
    see "rows" below).

    Example: one task (answer 4), n = 2 Voting episodes, 3 generators and an aggregator in each,
    outcome credit (every call gets its episode's final correctness):
      episode 0   generators answer 4, 5, 4; the aggregator picks solution 2 (a 5): wrong,
                  so all 4 calls get reward 0
      episode 1   generators answer 4, 4, 5; the aggregator picks solution 1 (a 4): right,
                  so all 4 calls get reward 1
      4 groups    (task, generator0, 0), (task, generator1, 0), (task, generator2, 0),
                  (task, aggregator, 0): each compares an instance's call in episode 0 with its
                  call in episode 1
      advantages  each group's rewards are {0, 1}: mean 0.5, unbiased std 0.7071, so
                  (0 - 0.5) / 0.7071 = -0.7071 for every call of episode 0 and +0.7071 for
                  every call of episode 1. Episode 0's generator0 answered right and still gets
                  -0.7071: the aggregator picked wrong, and outcome credit is the episode's.
      rows        SP: 8 rows, all on adapter `shared`; IP: 6 on `generator`, 2 on `aggregator`
    (tests/test_grpo.py, test_worked_example_voting_to_advantages, builds exactly this.)
    """
    calls = [(e.task.id, c) for e in episodes for c in e.calls]
    keys = [c.group_key(task_id) for task_id, c in calls]
    advantages = group_advantages([c.reward for _, c in calls], keys, scale_by_std)
    return [Row(c.prompt_ids, c.completion_ids, advantage, c.role, c.adapter)
            for (_, c), advantage in zip(calls, advantages)]


def role_shares(rows: list[Row], weights: list[float]) -> dict[str, float]:
    """Fraction of the total loss weight carried by each role's tokens (sums to 1), the roles in
    the order they first appear."""
    mass: dict[str, float] = defaultdict(float)
    for row, w in zip(rows, weights):
        mass[row.role] += w * len(row.completion_ids)
    total = sum(mass.values())
    return {r: m / total if total else 0.0 for r, m in mass.items()}


def minibatch_weights(rows: list[Row], cfg: UpdateSettings, size: int | None = None
                      ) -> list[float]:
    """Per-token weight of each row of one mini-batch: `token_weights`' aggregation, rescaled to
    the requested role shares if any. With `size`, the rows per optimizer step, a mini-batch of
    fewer rows counts them over `size`, as verl does, so that a partial last one (a role with a
    variable number of calls) takes a proportionally smaller step."""
    w = token_weights([len(row.completion_ids) for row in rows], cfg.agg, cfg.norm_len)
    if cfg.role_weights:
        shares = role_shares(rows, w)
        present = {r: cfg.role_weights.get(r, 0.0) for r in shares}
        norm = sum(present.values()) or 1.0
        # scale each role's tokens so its share becomes target / sum(targets of roles present)
        w = [wi * (present[row.role] / norm) / shares[row.role] if shares[row.role] else 0.0
             for row, wi in zip(rows, w)]
    if size is not None:
        w = [wi * len(rows) / size for wi in w]
    return w


@dataclass
class MiniBatch:
    """One optimizer step's rows; `size`, the rows per step its weights count them over
    (`minibatch_weights`); `mine`, the indices of the rows this process trains: all of them,
    but under torchrun this rank's, the others' being stand-ins without tokens that weigh the
    mini-batch (`without_tokens`); each role's share of the loss (finding 3), roles in order of
    appearance."""
    rows: list[Row]
    size: int
    mine: list[int]
    role_shares: dict[str, float]

    @property
    def roles(self) -> list[str]:
        return list(self.role_shares)


def mini_batches(rows: list[Row], cfg: UpdateSettings) -> list[MiniBatch]:
    """One adapter's rows cut into optimizer steps of `mini_batch_size` rows, or one step of all
    of them with --merge-instance-steps.

    Why IP takes 3 generator steps per training step (finding 4): --mini-batch-size defaults to a
    training step's episodes (tasks x n; the paper's 512 = 64 x 8), and under IP the `generator`
    adapter holds every generator call, n_votes = 3 per episode, so its rows make 3 mini-batches
    while the aggregator's 1 call per episode makes 1. Under SP all 4 calls per episode share one
    adapter: 4 steps.
    """
    if not rows:
        return []
    rows_per_step = len(rows) if cfg.merge_instance_steps else cfg.mini_batch_size
    assert rows_per_step > 0, "--mini-batch-size 0 (a step's episodes) is train.py's to resolve"
    steps = []
    for start in range(0, len(rows), rows_per_step):
        part = rows[start:start + rows_per_step]
        shares = role_shares(part, minibatch_weights(part, cfg, rows_per_step))
        steps.append(MiniBatch(part, rows_per_step, list(range(len(part))), shares))
    return steps


def without_tokens(row: Row) -> Row:
    """What another rank needs of a row to weigh a mini-batch (torchrun): its length and role."""
    return Row([], [0] * len(row.completion_ids), row.advantage, row.role, row.adapter)


def has_gradient(row: Row, cfg: UpdateSettings) -> bool:
    """False when the row's loss is 0 * ratio: advantage 0 and no KL term for its role."""
    return row.advantage != 0.0 or cfg.kl_coef.get(row.role, 0.0) > 0


def role_micro_batches(mb: MiniBatch, role: str, cfg: UpdateSettings) -> list[list[int]]:
    """The rows of `role` this process trains, as micro-batches of indices into `mb.rows`, sorted
    by length (`policies.micro_batches`): each pads to rows of about its own length, and a
    prompt's copies share one pass over it. --skip-zero-advantage leaves out rows without a
    gradient."""
    idx = [i for i in mb.mine if mb.rows[i].role == role
           and (has_gradient(mb.rows[i], cfg) or not cfg.skip_zero_advantage)]
    cuts = micro_batches([mb.rows[i].prompt_ids for i in idx],
                         [mb.rows[i].completion_ids for i in idx],
                         cfg.micro_batch_size, cfg.max_tokens_per_micro_batch)
    return [[idx[j] for j in cut] for cut in cuts]


def old_logprobs(model, adapter: str, steps: list[MiniBatch],
                 cfg: UpdateSettings) -> list[list[torch.Tensor | None]]:
    """Per mini-batch, each row's log-probs under the adapter as it is before this training step
    (None: the current ones, detached). The first mini-batch runs before the first optimizer
    step, so its ratio is exactly 1: only later mini-batches (IP parallel instances, a batch over
    `mini_batch_size`) need this extra no-grad forward."""
    later = [mb.rows[i] for mb in steps[1:] for i in mb.mine]
    scored = iter(policy_logprobs(model, adapter, [row.prompt_ids for row in later],
                                  [row.completion_ids for row in later], cfg.micro_batch_size,
                                  cfg.temperature, cfg.share_prompts,
                                  cfg.max_tokens_per_micro_batch) if later else [])
    return [[next(scored) if k and i in mb.mine else None for i in range(len(mb.rows))]
            for k, mb in enumerate(steps)]


def kl_to_base(model, micro: list[Row], logp: torch.Tensor, mask: torch.Tensor,
               cfg: UpdateSettings) -> torch.Tensor | None:
    """I1: the per-token KL(role || base), k3 estimator, [B, T]; None when no role of the
    micro-batch pays it (then the base model's no-grad forward is skipped)."""
    if not any(cfg.kl_coef.get(row.role, 0.0) > 0 for row in micro):
        return None
    model.eval()  # no-grad, in eval mode: its shared prompts keep their cache (completion_logprobs)
    with torch.no_grad(), use_adapter(model, None):
        ref_logp, _, _ = completion_logprobs(model, [row.prompt_ids for row in micro],
                                             [row.completion_ids for row in micro], cfg.temperature,
                                             share_prompts=cfg.share_prompts)
    model.train()
    log_r = ref_logp - logp
    return (torch.exp(log_r) - log_r - 1) * mask


# ---------------------------------------------------------------- the update

def update_policy(model, rows: list[Row], optimizers: dict, cfg: UpdateSettings,
                  grad_ema: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """One GRPO training step: each adapter is updated on its own rows, as in any PPO update.
    Returns the step's metrics (`role/name`); `grad_ema` carries I6's state between steps.
    `report` only records (`UpdateReport`). Under torchrun each rank cuts the mini-batches of
    every rank's rows and trains its own rows of each, and `distributed.sum_gradients` adds the
    ranks' gradients, so each rank steps as one process would (one process: the `else` branch,
    and `sum_gradients` does nothing)."""
    unknown = {r.adapter for r in rows if r.completion_ids} - set(optimizers)
    assert not unknown, f"rows for adapters without an optimizer: {sorted(unknown)}"
    grad_ema = {} if grad_ema is None else grad_ema
    report = UpdateReport(cfg)
    for adapter, (opt, _) in optimizers.items():
        params = adapter_parameters(model, adapter)
        mine = [r for r in rows if r.adapter == adapter and r.completion_ids]
        if distributed.data_parallel():  # every rank's rows, the others' as stand-ins
            everyone = distributed.every_rank_rows(mine, without_tokens)
            steps = distributed.mark_mine(mini_batches(everyone, cfg), mine)
        else:
            steps = mini_batches(mine, cfg)
        old = old_logprobs(model, adapter, steps, cfg)
        with use_adapter(model, adapter):
            model.train()
            progress = tqdm(steps, desc=f"update {adapter}", leave=False, disable=None)
            for mb, mb_old in zip(progress, old):
                opt.zero_grad(set_to_none=True)
                report.start(mb, params, sum(not has_gradient(mb.rows[i], cfg) for i in mb.mine))
                for role in sorted(mb.roles):  # role by role: under SP, each role's own gradient
                    for cut in role_micro_batches(mb, role, cfg):
                        loss, terms = micro_batch_loss(model, mb, cut, mb_old, cfg)
                        loss.backward()  # micro-batches add up to the mini-batch's gradient
                        report.micro_batch([mb.rows[i] for i in cut], *terms)
                    report.role_done(role, params)  # finding 3: update_report.role_gradient_shares
                zero_missing_grads(params)
                distributed.sum_gradients(params)
                lam = cfg.coherence.get(mb.roles[0])  # I6 (IP: one role per adapter), when named
                scale = coherence_scale(params, grad_ema, adapter, lam, cfg.coherence_window) \
                    if lam else None
                grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
                # skip a non-finite step (counted), and one whose roles all weigh 0 (a role
                # weighted 0: weight decay and Adam's momentum would still move the adapter)
                stepped = math.isfinite(grad_norm) and any(mb.role_shares.values())
                if stepped:
                    opt.step()
                opt.zero_grad(set_to_none=True)  # free the gradient before the next forward
                report.mini_batch(mb, grad_norm, stepped, scale)
            model.eval()
        report.learning_rate(adapter, opt)  # the lr this step used
        step_schedules(optimizers, adapter, bool(steps), cfg.lr_schedule)
    return report.metrics()


def micro_batch_loss(model, mb: MiniBatch, cut: list[int], old: list,
                     cfg: UpdateSettings) -> tuple[torch.Tensor, tuple]:
    """The part of the mini-batch `mb`'s loss from its rows `cut`, and the terms `UpdateReport`
    records. `old`: each row's log-probs before this training step (`old_logprobs`), or None."""
    micro = [mb.rows[i] for i in cut]
    # B rows over T columns (their longest completion, right-aligned): [B, T] each
    logp, mask, entropy = completion_logprobs(
        model, [r.prompt_ids for r in micro], [r.completion_ids for r in micro], cfg.temperature,
        with_entropy=True, share_prompts=cfg.share_prompts)
    old_logp = logp.detach().clone()  # None (the first mini-batch): ratio 1, gradient intact
    for b, i in enumerate(cut):
        if old[i] is not None:  # after an optimizer step: the stored ones, right-aligned
            old_logp[b, logp.shape[1] - len(old[i]):] = old[i].to(logp.device)
    adv = logp.new_tensor([r.advantage for r in micro])  # [B]: each row's group advantage
    # PPO's clipped surrogate -adv * ratio, ratio = exp(logp - old_logp)
    pg_loss, clipped = clipped_token_loss(logp, old_logp, adv, cfg.clip_low, cfg.clip_high,
                                          cfg.dual_clip)
    token_loss = pg_loss
    kl = kl_to_base(model, micro, logp, mask, cfg)  # I1: KL(role || base) per token, or None
    if kl is not None:  # beta * KL(role || base), for the roles --kl-coef names (beta 0 others)
        betas = logp.new_tensor([cfg.kl_coef.get(r.role, 0.0) for r in micro])
        token_loss = token_loss + betas[:, None] * kl
    # each row's per-token weight, counted over the whole mini-batch, so that the micro-batches
    # add up to the mini-batch's loss; mask: 1 on each row's completion tokens, 0 on padding
    weights = minibatch_weights(mb.rows, cfg, mb.size)
    w = logp.new_tensor([weights[i] for i in cut])[:, None]  # [B, 1]
    loss = (token_loss * mask * w).sum()
    return loss, (logp, old_logp, mask, entropy, pg_loss, clipped, kl)


def zero_missing_grads(params: list[torch.nn.Parameter]) -> None:
    """A parameter no row reached (all skipped) gets a zero gradient, not None: AdamW skips a None
    gradient, but must still apply momentum and weight decay as if the zero rows had run."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def coherence_scale(params: list[torch.nn.Parameter], grad_ema: dict[str, torch.Tensor],
                    adapter: str, lam: float, window: int) -> float:
    """I6, as the reference: shrink a gradient that keeps pointing where the recent ones pointed.

    scale = 1 - lam * clamp(cos(g, EMA g), 0, 1), applied before clipping, so it lies in
    [1 - lam, 1]. The EMA starts as the first gradient (so the first step is scaled by exactly
    1 - lam), then moves toward the *scaled* gradient with tau = 1 - 1/window.
    """
    g = flat_grad(params)
    ema = grad_ema.setdefault(adapter, g.clone())
    scale = 1.0 - lam * float(torch.nn.functional.cosine_similarity(g, ema, dim=0).clamp(0, 1))
    for p in params:
        if p.grad is not None:
            p.grad.mul_(scale)
    tau = 1.0 - 1.0 / window
    grad_ema[adapter] = tau * ema + (1 - tau) * g * scale
    return scale
