"""GRPO for every role of a workflow: the per-adapter update, the clipped loss, group advantages.

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

The file reads top-down. `update_policy` is the update on one page: per adapter, mini-batches;
per mini-batch, zero_grad, micro-batches (`micro_batch_loss`; backward), clip, step. A `MiniBatch`
carries what its loss needs besides the model (its rows, their per-token weights, after the first
optimizer step their log-probs from before it), so every term of the loss line is computed in
`micro_batch_loss`, in a function it calls or on the mini-batch. Then the helpers, in the order
they are called; the optimizers; the rows and their group advantages; last the settings
(`UpdateSettings`: every knob of advantages, loss and optimizer). What the update reports goes
through one seam, `UpdateReport` (infra/update_report.py), which changes no number. Under
torchrun, infra/distributed.py gives every rank the global batch's rows to cut into the same
mini-batches, marks the rows each rank trains (`MiniBatch.mine`) and sums the gradients. Metrics
are counted as numerator and denominator (infra/tallies.py) and turned into rates at the end.

    python -m pytest tests/test_grpo.py      # hand-computed checks of everything here
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Hashable, NamedTuple

import torch
from tqdm import tqdm

from infra import distributed
from infra.settings import setting
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


# ---------------------------------------------------------------- what the update works on

@dataclass
class Row:
    """One call, as the update sees it: one training row."""
    prompt_ids: list[int]
    completion_ids: list[int]
    advantage: float  # its reward against its GRPO group's (`training_rows`)
    role: str      # role type for metrics: generator0 -> generator
    adapter: str   # the adapter this call trains: SP `shared`, IP its role (route_adapter)


@dataclass
class MiniBatch:
    """One optimizer step's rows, and what their loss needs besides the model (`mini_batches`)."""
    rows: list[Row]
    size: int                      # rows per optimizer step, which `weights` count them over
    weights: list[float]           # each row's per-token weight in the loss (`minibatch_weights`)
    role_shares: dict[str, float]  # each role's share of the loss (finding 3), roles in order
    mine: list[int]                # the rows this process trains: all (torchrun: its rank's)
    # row -> its log-probs before this training step, one per token (`store_old_logprobs`); none
    # in the first mini-batch, which runs before any optimizer step: its old ones are its current
    old_logprobs: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def roles(self) -> list[str]:
        return list(self.role_shares)


class LossTerms(NamedTuple):
    """One micro-batch's loss terms, [B, T] each: what `UpdateReport.micro_batch` records."""
    logp: torch.Tensor          # each completion token's log-prob under the adapter now
    old_logp: torch.Tensor      # ... before this training step
    mask: torch.Tensor          # 1 on completion tokens, 0 on padding
    entropy: torch.Tensor
    pg_loss: torch.Tensor       # PPO's clipped surrogate
    clipped: torch.Tensor       # bool: where a clip bound
    kl: torch.Tensor | None     # I1: KL(role || base), or None where no role pays it


# ---------------------------------------------------------------- the update

def update_policy(model, rows: list[Row], optimizers: dict, cfg: UpdateSettings,
                  grad_ema: dict[str, torch.Tensor] | None = None) -> dict[str, float]:
    """One GRPO training step: each adapter is updated on its own rows, as in any PPO update.
    Returns the step's metrics (`role/name`); `grad_ema` carries I6's state between steps.
    `report` only records (`UpdateReport`). Under torchrun each rank trains its own rows of every
    mini-batch and `distributed.sum_gradients` adds the ranks' gradients, so each rank steps as
    one process would (one process: `sum_gradients` does nothing)."""
    unknown = {r.adapter for r in rows if r.completion_ids} - set(optimizers)
    assert not unknown, f"rows for adapters without an optimizer: {sorted(unknown)}"
    grad_ema = {} if grad_ema is None else grad_ema
    report = UpdateReport(cfg)
    for adapter, (opt, _) in optimizers.items():
        params = adapter_parameters(model, adapter)
        own = [r for r in rows if r.adapter == adapter and r.completion_ids]
        steps = rank_mini_batches(own, cfg)  # each with its rows' weights (torchrun: `mine` marked)
        store_old_logprobs(model, adapter, steps, cfg)  # on them, before the first optimizer step
        with use_adapter(model, adapter):
            model.train()
            for mb in tqdm(steps, desc=f"update {adapter}", leave=False, disable=None):
                opt.zero_grad(set_to_none=True)
                report.start(mb, params, sum(not has_gradient(mb.rows[i], cfg) for i in mb.mine))
                for role in sorted(mb.roles):  # role by role: under SP, each role's own gradient
                    for cut in role_micro_batches(mb, role, cfg):
                        loss, terms = micro_batch_loss(model, mb, cut, cfg)
                        loss.backward()  # micro-batches add up to the mini-batch's gradient
                        report.micro_batch([mb.rows[i] for i in cut], terms)
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


def micro_batch_loss(model, mb: MiniBatch, cut: list[int], cfg: UpdateSettings
                     ) -> tuple[torch.Tensor, LossTerms]:
    """The part of the mini-batch `mb`'s loss from its rows `cut`, and its terms."""
    micro = [mb.rows[i] for i in cut]
    # B rows over T columns (their longest completion, right-aligned): [B, T] each
    logp, mask, entropy = completion_logprobs(
        model, [r.prompt_ids for r in micro], [r.completion_ids for r in micro], cfg.temperature,
        with_entropy=True, share_prompts=cfg.share_prompts, entropy_grad=cfg.entropy_coef > 0)
    # the rows' log-probs before this training step: stored on the mini-batch, or in the first
    # mini-batch (none stored: no optimizer step yet) the current ones, detached: ratio 1
    old_logp = right_aligned([mb.old_logprobs[i] for i in cut], logp) if mb.old_logprobs \
        else logp.detach()
    adv = logp.new_tensor([r.advantage for r in micro])  # [B]: each row's group advantage
    # PPO's clipped surrogate -adv * ratio, ratio = exp(logp - old_logp)
    pg_loss, clipped = clipped_token_loss(logp, old_logp, adv, cfg.clip_low, cfg.clip_high,
                                          cfg.dual_clip)
    token_loss = pg_loss
    if cfg.entropy_coef:  # an entropy bonus: its entropy then carries its gradient
        token_loss = token_loss - cfg.entropy_coef * entropy
    kl = kl_to_base(model, micro, logp, mask, cfg)  # I1: KL(role || base) per token, or None
    if kl is not None:  # beta * KL(role || base), for the roles --kl-coef names (beta 0 others)
        betas = logp.new_tensor([cfg.kl_coef.get(r.role, 0.0) for r in micro])
        token_loss = token_loss + betas[:, None] * kl
    # each row's per-token weight, counted over the whole mini-batch, so that the micro-batches
    # add up to the mini-batch's loss; mask: 1 on each row's completion tokens, 0 on padding
    w = logp.new_tensor([mb.weights[i] for i in cut])[:, None]  # [B, 1]
    loss = (token_loss * mask * w).sum()
    return loss, LossTerms(logp, old_logp, mask, entropy, pg_loss, clipped, kl)


# ---------------------------------------------------------------- the loss's terms

def right_aligned(rows: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Per-row vectors as one tensor shaped like `like` [B, T], each row in its last columns (as
    `completion_logprobs` lays out a completion), zeros before it."""
    out = torch.zeros_like(like)
    for b, row in enumerate(rows):
        out[b, like.shape[1] - len(row):] = row.to(like.device)
    return out


def clipped_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                       clip_low: float = 0.2, clip_high: float = 0.28, dual_clip: float = 3.0
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, with clip-higher and dual clip (verl's form).

    logp, old_logp: [B, T]; adv: [B]. Returns (loss [B, T], clipped [B, T] bool). For A > 0 the
    ratio is capped at 1 + clip_high; for A < 0 it is floored at 1 - clip_low, and the loss is
    also capped at -A * dual_clip so a huge ratio on a bad row cannot blow up the step. The
    defaults are the paper's and UpdateSettings' (tests/test_grpo.py holds them equal).
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


# ---------------------------------------------------------------- mini-batches

def rank_mini_batches(rows: list[Row], cfg: UpdateSettings) -> list[MiniBatch]:
    """An adapter's rows as its optimizer steps (`mini_batches`). Under torchrun every rank cuts
    the mini-batches of every rank's rows, the others' as stand-ins without tokens
    (`without_tokens`), so that the weights are the global batch's, and marks its own `mine`."""
    if not distributed.data_parallel():
        return mini_batches(rows, cfg)
    everyone = distributed.every_rank_rows(rows, without_tokens)
    return distributed.mark_mine(mini_batches(everyone, cfg), rows)


def mini_batches(rows: list[Row], cfg: UpdateSettings) -> list[MiniBatch]:
    """One adapter's rows cut into optimizer steps of `mini_batch_size` rows, or one step of all
    of them with --merge-instance-steps, each with its rows' per-token weights and role shares.

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
        weights = minibatch_weights(part, cfg, rows_per_step)
        steps.append(MiniBatch(part, rows_per_step, weights, role_shares(part, weights),
                               mine=list(range(len(part)))))
    return steps


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


def role_shares(rows: list[Row], weights: list[float]) -> dict[str, float]:
    """Fraction of the total loss weight carried by each role's tokens (sums to 1), the roles in
    the order they first appear."""
    mass: dict[str, float] = defaultdict(float)
    for row, w in zip(rows, weights):
        mass[row.role] += w * len(row.completion_ids)
    total = sum(mass.values())
    return {r: m / total if total else 0.0 for r, m in mass.items()}


def without_tokens(row: Row) -> Row:
    """What another rank needs of a row to weigh a mini-batch (torchrun): its length and role."""
    return Row([], [0] * len(row.completion_ids), row.advantage, row.role, row.adapter)


def store_old_logprobs(model, adapter: str, steps: list[MiniBatch], cfg: UpdateSettings) -> None:
    """Each trained row's log-probs under the adapter as it is before this training step, stored
    on its mini-batch (`MiniBatch.old_logprobs`). The first mini-batch runs before the first
    optimizer step, so its ratio is exactly 1 without them: only later mini-batches (IP parallel
    instances, a batch over `mini_batch_size`) need this extra no-grad forward. It runs the
    update's own micro-batches, so that at equal weights it computes what the update computes
    (other padding rounds otherwise in bf16, and the ratio would move by numerics alone)."""
    for mb in steps[1:]:
        for cut in (c for role in sorted(mb.roles) for c in role_micro_batches(mb, role, cfg)):
            scored = policy_logprobs(model, adapter, [mb.rows[i].prompt_ids for i in cut],
                                     [mb.rows[i].completion_ids for i in cut], len(cut),
                                     cfg.temperature, cfg.share_prompts)
            mb.old_logprobs.update(zip(cut, scored))


def has_gradient(row: Row, cfg: UpdateSettings) -> bool:
    """False when the row's loss is 0 * ratio: advantage 0, no KL term for its role and no entropy
    bonus."""
    return row.advantage != 0.0 or cfg.kl_coef.get(row.role, 0.0) > 0 or cfg.entropy_coef > 0


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


# ---------------------------------------------------------------- the optimizer step

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


# ---------------------------------------------------------------- the optimizers (train.py's)

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


# ---------------------------------------------------------------- rows and advantages (made first)

def training_rows(episodes: list, scale_by_std: bool = True) -> list[Row]:
    """Every call of every episode as one GRPO row: its reward compared within its group
    (`group_advantages`, just below), its tokens, its role type and the adapter it trains
    (`Call.adapter`, which the rollout set from the policy with policies.route_adapter: the one
    thing SP and IP change, see "rows" below). `scale_by_std`: --std-scale (UpdateSettings).

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
    # a call's GRPO group, the calls its reward is compared with: the same task, call name and
    # turn (Voting's generator0 of each episode), or the group its workflow names (Eval-Opt's
    # attempts share one)
    groups = [(task_id, c.group) if c.group else (task_id, c.name, c.turn) for task_id, c in calls]
    advantages = group_advantages([c.reward for _, c in calls], groups, scale_by_std)
    return [Row(c.prompt_ids, c.completion_ids, advantage, c.role, c.adapter)
            for (_, c), advantage in zip(calls, advantages)]


def group_advantages(rewards: list[float], keys: list[Hashable], scale_by_std: bool = True,
                     eps: float = 1e-6) -> list[float]:
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


# ---------------------------------------------------------------- the settings

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


@dataclass
class UpdateSettings:
    """GRPO's knobs: advantages, the loss, the optimizer. Each field made with `setting` is one flag
    of train.py (infra/settings.py; infra/flags.py makes the flag): its default, its flag, its
    help, the paper's value (`paper`) and the values it takes (`within`, `choices`). A 0 that
    stands for a computed value, and a plain field, are given by train.py's `settings_from_flags`.
    A new knob is one field here, read as `cfg.<name>` where the update uses it."""
    std_scale: bool = setting(True, "--std-scale", "advantage = (r - mean) / std; --no-std-scale: "
                              "r - mean (Dr. GRPO)", group="GRPO (grpo.UpdateSettings)", paper=True)
    mini_batch_size: int = setting(0, "--mini-batch-size", "rows per optimizer step; 0 = a step's "
                                   "episodes", within="[0, inf)", paper=512)
    micro_batch_size: int = setting(8, "--micro-batch-size", "rows per forward/backward at most "
                                    "(memory only: the gradient is the same)", within="[1, inf)")
    max_tokens_per_micro_batch: int = setting(0, "--max-tokens-per-micro-batch", "padded tokens "
        "per forward/backward at most; 0 = rows only", within="[0, inf)", paper=51200)  # verl's
    agg: str = setting("seq-mean-token-mean", "--agg", "loss aggregation: how much each token "
        "counts (grpo.token_weights)", choices=AGGREGATIONS, paper="seq-mean-token-mean")
    norm_len: int | None = None  # seq-mean-token-sum-norm's length: train.py's --max-new-tokens
    clip_low: float = setting(0.2, "--clip-low", "PPO clip below 1", within="(0, 1)", paper=0.2)
    clip_high: float = setting(0.28, "--clip-high", "PPO clip above 1 (clip-higher)",
                               within="(0, inf)", paper=0.28)
    dual_clip: float = setting(3.0, "--dual-clip", "dual-clip constant: a negative advantage's "
                               "loss is capped at -A x this", within="(1, inf)", paper=3)
    temperature: float = setting(0.7, "--temperature", "sampling temperature; the update takes its "
                                 "log-probs at it too", within="[0, inf)", paper=0.7)
    role_weights: dict[str, float] = setting({}, "--role-weights", "SP: loss share per role, "
        "'equal' or generator=2,aggregator=1; none: the aggregation's own shares (as the paper)",
        within="[0, inf)")
    merge_instance_steps: bool = setting(False, "--merge-instance-steps", "finding 4: one "
        "optimizer step per adapter per training step, not one per mini-batch", paper=False)
    kl_coef: dict[str, float] = setting({}, "--kl-coef", "I1: role=beta,... adds beta * KL(role || "
                                        "base) (k3)", within="(0, inf)")
    entropy_coef: float = setting(0.0, "--entropy-coef", "entropy bonus: the loss minus this x "
        "each token's entropy (verl's entropy_coeff); 0: off", within="[0, inf)", paper=0)
    coherence: dict[str, float] = setting({}, "--coherence", "I6 (IP): role=lambda,... lambda in "
                                          "(0, 1]", within="(0, 1]", paper="<= 0.3")
    coherence_window: int = setting(128, "--coherence-window", "I6: EMA window, tau = 1 - 1/window",
                                    within="[1, inf)", paper=128)
    share_prompts: bool = setting(True, "--share-prompts", "rows that share a prompt run it once "
                                  "(--no-share-prompts: each row its whole prompt)")
    skip_zero_advantage: bool = setting(False, "--skip-zero-advantage", "skip calls with advantage "
        "0: the same step, less work (entropy and clip_frac then cover the trained calls)")
    lr: float = setting(5e-4, "--lr", "AdamW learning rate, per adapter", within="(0, inf)",
                        paper="2e-5 at rank 64", group="optimisation (grpo.UpdateSettings)")
    weight_decay: float = setting(0.01, "--weight-decay", "AdamW weight decay", within="[0, inf)",
                                  paper=0.01)
    warmup_steps: int = setting(3, "--warmup-steps", "linear warm-up steps", within="[0, inf)",
                                paper=15)
    lr_schedule: str = setting("constant", "--lr-schedule", "after warm-up; cosine: to 0 at the "
        "last step (the paper's config); verl-constant: what its runs did, from lr 0, counting "
        "adapter updates (cells)", choices=["constant", "cosine", "verl-constant"])
    max_grad_norm: float = setting(1.0, "--max-grad-norm", "gradient clipping per adapter",
                                   within="(0, inf)", paper=1)
