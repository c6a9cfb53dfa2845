"""The static decode's shapes: the rows, cache columns and mask widths of its calls, from a few
sizes, so that a run records a bounded number of CUDA graphs (infra/decoding.py's GRAPH_LIMIT).

What it is for. On CUDA, cudagraph trees record one graph for each distinct (rows, cache columns,
mask width) the compiled decode step is called with, and keep every one. Left free, the three
follow the data: a call's rows what its widest prompt lets the token budget hold, its columns that
prompt to within a block, its mask width the filled columns block by block (a call of 5,120 new
tokens walks 40 widths). A paper cell's 500 steps, rehearsed on the CPU, then reach thousands of
shapes (bench/README.md, "A cell's CUDA graphs, rehearsed"). Here all three come from one series,
`size_at_least`: 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and 1.5 times them):
  - a mask width is CACHE_BLOCK times a size (128, 256, 384, 512, 768, 1,024, 1,536, ...) at or
    above the columns filled (`mask_width`): geometric, not a block at a time;
  - a call's cache is its widest width and a spare block (`cache_columns`);
  - a call holds the rows its columns allow within the budget (`call_rows`); a call cut short (a
    group's last, or the last before wider prompts) is padded up to a size (`cut_calls`) with
    copies of its last prompt, which stop at their first token (`PaddingRows`) and are never
    returned: rows never read each other, so the real rows keep their distributions (the random
    stream, shared by the rows, gives them other draws than a call without the copies).
A column count then has one full row count and the sizes below it, and a call walks the widths
from its prompt's to its end's. bench/decode_rehearsal.py runs a cell's schedule through these
functions and counts what it reaches.

What it costs. A padding row is computed like a real one (its attention reads its columns too); a
decode step reads up to 1.5x the columns filled (before: at most a block more), and a cache's
columns round up to a width, so a call holds up to 1.5x fewer rows than the budget would allow at
its exact width. The rehearsal states them for every cell (bench/README.md): 0-2.1% of the rows
computed are padding, and a step reads 19-22% more columns than are filled.

    python bench/decode_rehearsal.py --cells Voting-IP-1.7B-Math      # a cell's shapes, seconds
"""
from __future__ import annotations

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

# the unit of a mask width and of a cache's columns
CACHE_BLOCK = 128


def size_at_least(n: int) -> int:
    """The smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k and 3 x 2^(k-1): each at most 1.5x the
    one before) that is at least n. Example: 2 -> 2, 5 -> 6, 7 -> 8, 13 -> 16, 17 -> 24."""
    power = 1 << max(0, (n - 1).bit_length() - 1)  # the largest power of two below n (1 for n <= 2)
    return power if power >= n else 3 * power // 2 if 3 * power // 2 >= n else 2 * power


def blocks(columns: int) -> int:
    """`columns` rounded up to a multiple of CACHE_BLOCK. Example: 1 -> 128, 129 -> 256."""
    return -(-columns // CACHE_BLOCK) * CACHE_BLOCK


def mask_width(filled: int) -> int:
    """The columns a static step's attention reads when `filled` are filled (this step's included):
    CACHE_BLOCK times the size at or above their blocks. Example: 300 -> 384, 600 -> 768 (6
    blocks), 1,100 -> 1,536 (9 blocks -> 12), 5,632 -> 6,144."""
    return CACHE_BLOCK * size_at_least(blocks(filled) // CACHE_BLOCK)


def cache_columns(tokens: int) -> int:
    """A static cache's columns for a call of `tokens` (prompt + new): the widest mask width it
    reaches and one spare block, so that a mask never spans the whole cache (at equal widths the
    attention's K and V are the whole cache, contiguous, which the compiled step guards on: the
    call's last width would compile again). Example: 300 -> 512, 1,232 -> 1,664."""
    return mask_width(tokens) + CACHE_BLOCK


def call_rows(columns: int, sampling_tokens: int, max_rows: int, max_tokens: int) -> int:
    """The most rows a static call of `columns` columns holds: at most `max_rows`, and within
    `max_tokens`, each row counting its columns and its sampling buffers (`sampling_tokens`,
    infra/memory.GenerationBudget); at least 1. Example: 1,664 columns, 30, 64 rows, 50,000 tokens
    -> 29."""
    return max(1, min(max_rows, max_tokens // (columns + sampling_tokens)))


def cut_calls(widths: list[int], new_tokens: int, sampling_tokens: int, max_rows: int,
              max_tokens: int) -> list[tuple[int, int, int, int]]:
    """One adapter's rows cut into static calls, from their prompts' widths in ascending order: per
    call (start, stop, rows, columns), the rows [start, stop) in a call that computes `rows` rows
    on a cache of `columns` (`cache_columns` of its widest prompt and `new_tokens`). A call takes
    rows while its columns allow them (`call_rows`); a call with fewer is padded up to a size
    (`size_at_least`), within that most, and at least 2 (the compiler specialises a size of 1).
    Example: widths [10] * 5, 20 new tokens, 0, 2 rows, any tokens -> (0, 2, 2, 256), (2, 4, 2,
    256), (4, 5, 2, 256); at 4 rows -> (0, 4, 4, 256), (4, 5, 2, 256); widths [10] * 5 at 8 rows
    -> (0, 5, 6, 256)."""
    calls, start = [], 0
    while start < len(widths):
        stop, columns = start + 1, cache_columns(widths[start] + new_tokens)
        most = call_rows(columns, sampling_tokens, max_rows, max_tokens)
        while stop < len(widths) and stop - start < most:
            if (wider := cache_columns(widths[stop] + new_tokens)) > columns:  # fewer rows
                fewer = call_rows(wider, sampling_tokens, max_rows, max_tokens)
                if stop - start >= fewer:
                    break
                columns, most = wider, fewer
            stop += 1
        rows = min(most, size_at_least(stop - start))  # a full call's is its own size
        calls.append((start, stop, max(2, rows), columns))
        start = stop
    return calls


def static_calls(prompts: list[list[int]], new_tokens: int, sampling_tokens: int, max_rows: int,
                 max_tokens: int) -> list[tuple[list[int], int]]:
    """The static calls of one adapter's `prompts` (`cut_calls`): each call's row indices, padded
    up with copies of its last, and how many come first as its real rows. Rows are ordered by
    prompt length and prompt, a prompt's copies adjacent (sharing their prompt pass), as
    policies.micro_batch_order orders them."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), prompts[i]))
    calls = cut_calls([len(prompts[i]) for i in order], new_tokens, sampling_tokens, max_rows,
                      max_tokens)
    return [(order[start:stop] + order[stop - 1:stop] * (rows - stop + start), stop - start)
            for start, stop, rows, _ in calls]


def engine_calls(engine, prompts: list[list[int]], micro_batches) -> list[tuple[list[int], int]]:
    """The HF engine's calls of one group of `prompts` (decoding.call_groups): each call's row
    indices and how many come first as its real rows. Dynamic: `micro_batches` (policies', the
    update's cut: rows by prompt, cut at `engine.batch_size` rows and `engine.max_tokens` tokens,
    each row counted at its prompt, `max_new_tokens` and `sampling_tokens`), every row real.
    Static: `static_calls`."""
    if engine.decode == "dynamic":
        counted = [[0] * (engine.max_new_tokens + engine.sampling_tokens)] * len(prompts)
        return [(c, len(c)) for c in micro_batches(prompts, counted, engine.batch_size,
                                                   engine.max_tokens)]
    return static_calls(prompts, engine.max_new_tokens, engine.sampling_tokens, engine.batch_size,
                        engine.max_tokens)


def padding_stop(real: int, rows: int) -> dict:
    """generate()'s keywords for a call of `rows` rows whose first `real` are real: a stopping
    criterion that ends the padding rows at their first token (`PaddingRows`), or none."""
    return {"stopping_criteria": StoppingCriteriaList([PaddingRows(real)])} if rows > real else {}


class PaddingRows(StoppingCriteria):
    """generate()'s stopping criterion for a call's padding rows, its rows from `real` on: ended at
    their first token, so a padding row never makes a call run longer than its real rows."""

    def __init__(self, real: int):
        self.real, self.done = real, None

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        if self.done is None:  # the same rows at every step: made once (generate ORs it in anew)
            rows = torch.arange(input_ids.shape[0], device=input_ids.device)
            self.done = rows >= self.real  # [B] bool, on the device: no host read
        return self.done
