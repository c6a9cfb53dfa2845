"""The GPU check's ratio check: bf16's importance ratio at identical weights, with LoRA active (bench/gpu_check.py
runs it as part 1's second check).

What it is for: PPO's ratio exp(new - old) must be 1 when the weights have not moved. The old log-probs come from a
no-grad pass and the new ones from the update's pass; if the two compute differently (a shared prompt pass against
full rows, other micro-batches, kernels), bf16 rounding moves the ratio by numerics alone, and the clip can cut
gradients nobody meant to cut. This check measures that on a cell's shape: the clip fraction and approximate KL of a
zero-learning-rate update's later mini-batches. What it is not: a check of the sampler against the trainer (vLLM's
drift is the training check's) or of training speed.

    python3 bench/gpu_check.py --only ratio            # on the GPU machine
    python3 bench/gpu_check.py --only ratio --small    # the CPU rehearsal: tiny-qwen3 in bf16
"""
from __future__ import annotations

import math

RATIO_ENTROPY = 0.75   # nats a sampled token: a trained model's 0.5-1 (random weights: ~11.5 over Qwen3's vocabulary)
RATIO_BOUNDS = {"clip_frac": 0.005, "approx_kl": 1e-4}  # check_ratio gives the reasons
LORA_B_STD = 0.01  # the ratio check's active LoRA: B of a trained adapter's order (PEFT starts it at 0)


def entropy_scale(lm, rows: list[tuple[list[int], int]], temperature: float, target: float) -> float:
    """The factor on the LM head at which the next-token entropy over `rows`' positions from `start` on (each
    row (ids, start); the positions that predict its sampled tokens), at `temperature`, is
    `target` nats, against its weights before any scaling: bisection on its log (entropy falls as the head
    grows). A random model's head gives ~11.5 nats
    over Qwen3's vocabulary, where a trained model's sampled tokens have 0.5-1."""
    import torch
    base = lm.get_base_model()
    with torch.no_grad():
        hidden = torch.cat([base.get_decoder()(input_ids=torch.tensor([ids], device=lm.device)
                                               ).last_hidden_state[0, max(start - 1, 0):-1] for ids, start in rows])
        logits = base.get_output_embeddings()(hidden).float() / temperature

        def entropy(log_scale: float) -> float:
            return torch.distributions.Categorical(logits=math.exp(log_scale) * logits).entropy().mean().item()
        low, high = -8.0, 8.0  # the factor's log, relative to the head now: e^-8 to e^8
        for _ in range(30):
            mid = (low + high) / 2
            low, high = (mid, high) if entropy(mid) > target else (low, mid)
    return math.exp((low + high) / 2) * getattr(base.get_output_embeddings(), "scaled", 1.0)


def sample_rows(lm, tokenizer, prompts: list[list[int]], per_group: int, new: int, scale: float) -> list:
    """GRPO rows of `per_group` samples per prompt (advantages +-1) with the LM head at `scale` (a new parameter:
    the tied input embedding keeps its weights)."""
    import torch

    import policies
    from grpo import Row
    head = lm.get_base_model().get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach() * scale / getattr(head, "scaled", 1.0),
                                     requires_grad=False)
    head.scaled = scale
    calls = [p for p in prompts for _ in range(per_group)]
    # the dynamic decode: nothing to compile in this check's bound (the training check times the static one)
    engine = policies.HFEngine(lm, tokenizer, new, 0.7, decode="dynamic")
    samples = engine.generate(calls, ["generator"] * len(calls))
    return [Row(p, s.completion_ids, (-1.0) ** k, "generator", "generator")
            for k, (p, s) in enumerate(zip(calls, samples))]


def lora_active(lm, seed: int, std: float = LORA_B_STD) -> None:
    """Every lora_B drawn from N(0, std) (PEFT starts it at 0, where LoRA's output is exactly 0 and its bf16
    path is never exercised)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if "lora_B" in name:
                p.copy_(std * torch.randn(p.shape, generator=g))


def check_ratio(small: bool, model: str) -> tuple[str, str]:
    """bf16's importance ratio at identical weights, LoRA active (`lora_active`): sampled rows (the dynamic
    decode), then a zero-learning-rate update in three mini-batches; mini-batches 2-3 take their old log-probs
    from the no-grad pass (policy_logprobs, eval mode) and their new ones from the update's (gradients,
    checkpointing), so their clip fraction and approx KL are what numerics alone cause. Under checkpointing both
    run full rows in the update's micro-batches (policies.completion_logprobs, grpo.store_old_logprobs): on the CPU
    they are 0. The random head is scaled until the next-token entropy is RATIO_ENTROPY nats, a trained
    model's. Bounds (RATIO_BOUNDS): approx KL 1e-4 nats a token is an RMS log-prob difference of sqrt(2e-4) =
    0.014, a ratio within 1.4%, 14 times inside the clip's 0.2; clip fraction 0.5%: at most 1 token in 200
    losing its gradient by chance."""
    import torch

    import policies
    from grpo import UpdateSettings, make_optimizers, mini_batches, update_policy
    device = "cpu" if small else "cuda"
    torch.manual_seed(0)
    base, tokenizer = policies.load_model(model, torch.bfloat16, device)
    lm = policies.add_adapters(base, ["generator"], rank=64, alpha=32)
    policies.enable_grad_checkpointing(lm)
    lora_active(lm, seed=5)
    groups, per_group, (prompt_len, new) = 3, 4 if small else 8, (32, 32) if small else (256, 128)
    g = torch.Generator().manual_seed(3)
    vocab = min(1000, lm.config.vocab_size)
    prompts = [torch.randint(0, vocab, (prompt_len,), generator=g).tolist() for _ in range(groups)]
    random_head, rows, scale = model.startswith(("random-", "tiny")), [], 1.0
    for length in (new // 4, new) if random_head else (new,):  # random: scaled on short samples first
        if random_head:
            scored = [(r.prompt_ids + r.completion_ids, len(r.prompt_ids)) for r in rows]
            scale = entropy_scale(lm, scored or [(p, 0) for p in prompts], 0.7, RATIO_ENTROPY)
        rows = sample_rows(lm, tokenizer, prompts, per_group, length, scale)
    cfg = UpdateSettings(mini_batch_size=per_group, micro_batch_size=per_group, temperature=0.7)
    opts = make_optimizers(lm, ["generator"], UpdateSettings(lr=0.0, weight_decay=0.0), 10)
    m = update_policy(lm, rows, opts, cfg)
    tokens = sum(len(r.completion_ids) for r in rows)
    later = tokens - sum(len(r.completion_ids) for r in mini_batches(rows, cfg)[0].rows)
    clip, kl = (m[f"generator/{k}"] * tokens / later for k in ("clip_frac", "approx_kl"))  # mini-batch 1: 0
    detail = (f"LM head x{scale:.2f}, sampled tokens' entropy {m['generator/entropy']:.2f} nats (target "
              f"{RATIO_ENTROPY}); {len(rows)} rows, {later} tokens in mini-batches 2-3: clip fraction {clip:.4f} "
              f"(bound {RATIO_BOUNDS['clip_frac']}), approx KL {kl:.2e} (bound {RATIO_BOUNDS['approx_kl']:.0e})")
    ok = clip <= RATIO_BOUNDS["clip_frac"] and kl <= RATIO_BOUNDS["approx_kl"] and not m["nonfinite_steps"]
    return ("pass" if ok else "FAIL"), detail
