"""What the GRPO update reports: per-role statistics, each role's own gradient under SP, I6's scale.

What it is for: the diagnostics seam of grpo.update_policy, which calls an `UpdateReport` at named
points (`start`, `micro_batch`, `role_done`, `mini_batch`, `learning_rate`) and returns its
`metrics()`; the update computes nothing for it. What it is not: the update (grpo.py, "GRPO as
trained" in docs/method.md); it never imports the concept files, so the settings and the rows are
passed in. The metrics it names are listed in docs/evaluation.md.

    python -m pytest tests/test_grpo.py      # the metrics against hand-computed values
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch

from infra import distributed
from infra.tallies import Tallies, add_mean, add_tallies, add_total, rates, read_back


def flat_grad(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """The parameters' gradients as one float vector (a missing gradient as zeros)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    return torch.cat([g.flatten() for g in grads]).float()


class UpdateReport:
    """What the update reports, and nothing it computes: `update_policy` calls it at named points.

    Per-role token statistics (`micro_batch`), the mini-batch's metrics (`mini_batch`), and under
    SP each role's own gradient (`start`, `role_done`: the loss is a sum, so snapshots of the
    accumulated gradient between roles give each role's part for free). Numbers are numerator and
    denominator (infra/tallies.py), added over torchrun's ranks in `metrics`.
    """

    def __init__(self, cfg):
        self.cfg = cfg  # grpo.UpdateSettings
        self.tallies: Tallies = defaultdict(lambda: [0.0, 0.0])
        self.tallies["nonfinite_steps"][1] = 1.0  # a total, 0 unless a step is skipped
        if cfg.skip_zero_advantage:  # each rank counts its own rows: one denominator in all
            self.tallies["skipped_rows"][1] = float(distributed.world()[0] == 0)
        self.role_grads: dict[str, torch.Tensor] = {}
        self.before: torch.Tensor | None = None  # the gradient before the current role's rows
        self.first_adapter: str | None = None

    def start(self, mb, params: list[torch.nn.Parameter], without_gradient: int) -> None:
        """Before a mini-batch's backward: the rows it skips (of this rank's, `without_gradient`
        have none), and with several roles, the gradient."""
        if self.cfg.skip_zero_advantage:
            self.tallies["skipped_rows"][0] += without_gradient
        self.role_grads = {}
        self.before = flat_grad(params) if len(mb.roles) > 1 else None

    def role_done(self, role: str, params: list[torch.nn.Parameter]) -> None:
        """After a role's backward, with several roles: its own gradient, the difference."""
        if self.before is not None:
            after = flat_grad(params)
            self.role_grads[role], self.before = after - self.before, after

    @torch.no_grad()
    def micro_batch(self, micro: list, terms) -> None:
        """Per-role token statistics of a micro-batch's loss terms (grpo.LossTerms, [B, T] each)
        as (sum over tokens, tokens), averaged per token at the end; the sums stay on the device
        (`mini_batch` reads them)."""
        mask = terms.mask
        log_ratio = (terms.logp - terms.old_logp) * mask
        per_row = {"pg_loss": (terms.pg_loss * mask).sum(1),  # [B] each
                   "clip_frac": (terms.clipped.float() * mask).sum(1),
                   "entropy": terms.entropy.sum(1), "approx_kl": (0.5 * log_ratio ** 2).sum(1)}
        if terms.kl is not None:
            per_row["kl_base"] = terms.kl.sum(1)
        for role in dict.fromkeys(row.role for row in micro):  # the roles in row order
            mine = [i for i, row in enumerate(micro) if row.role == role]
            index = torch.tensor(mine, device=mask.device)
            tokens = sum(len(micro[i].completion_ids) for i in mine)
            for name, values in per_row.items():
                if name != "kl_base" or self.cfg.kl_coef.get(role, 0.0) > 0:
                    add_mean(self.tallies, f"{role}/{name}", values[index].sum(), tokens)

    def mini_batch(self, mb, grad_norm: float, stepped: bool,
                   scale: float | None) -> None:
        """After a mini-batch's step: each role's loss share, its own gradient's norm, share and
        cosines (SP), the I6 scale, the norm before clipping, the steps taken or skipped."""
        tallies = self.tallies
        read_back(tallies)  # the token sums, in one copy
        for role, share in mb.role_shares.items():
            add_mean(tallies, f"{role}/loss_share", share)
        distributed.all_reduce_sum(list(self.role_grads.values()))  # torchrun: every rank's part
        for key, value in role_gradient_shares(self.role_grads).items():  # empty for one role
            add_mean(tallies, key, value)
        if scale is not None:
            add_mean(tallies, f"{mb.roles[0]}/coherence_scale", scale)
        add_total(tallies, "nonfinite_steps", not math.isfinite(grad_norm))
        for role in mb.roles:
            add_total(tallies, f"{role}/opt_steps", stepped)
            add_mean(tallies, f"{role}/grad_norm", grad_norm)

    def learning_rate(self, adapter: str, opt: torch.optim.Optimizer) -> None:
        self.first_adapter = self.first_adapter or adapter  # the step's `lr` is the first's
        add_mean(self.tallies, f"{adapter}/lr", opt.param_groups[0]["lr"])

    def metrics(self) -> dict[str, float]:
        """The step's metrics; under torchrun every rank's counts added (the same on every rank)."""
        m = rates(add_tallies(distributed.gather(dict(self.tallies))))
        m["lr"] = m.get(f"{self.first_adapter}/lr") or 0.0
        return m


def role_gradient_shares(role_grads: dict[str, torch.Tensor]) -> dict[str, float]:
    """Finding 3, under SP: each role's own gradient norm (before clipping), its share of the roles'
    summed norms (how much of the shared adapter's update each role drives), and the cosine between
    every pair of roles with a gradient. `role_grads` are the differences `role_done` snapshots: the
    loss is a sum, so each role's rows contribute their own gradient exactly."""
    norms = {r: float(g.norm()) for r, g in role_grads.items()}
    out = {f"{r}/role_grad_norm": n for r, n in norms.items()}
    total = sum(norms.values())
    if total > 0:  # a zero gradient (every advantage 0) has no shares: left out, not counted as 0
        out.update({f"{r}/grad_norm_share": n / total for r, n in norms.items()})
    roles = sorted(r for r in role_grads if norms[r] > 0)  # a cosine needs two nonzero gradients
    for i, a in enumerate(roles):
        for b in roles[i + 1:]:
            cos = torch.cosine_similarity(role_grads[a], role_grads[b], dim=0)
            out[f"grad_cos/{a}-{b}"] = float(cos)
    return out
