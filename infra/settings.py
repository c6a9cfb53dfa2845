"""One setting, one line: `setting()` makes a field of a settings dataclass that describes its flag.

What it is for: the one idiom in which train.py's `Settings`, grpo.UpdateSettings and
workflows.WorkflowOptions declare their fields, as CleanRL's Args declares its flags:

    lr: float = setting(5e-4, "--lr", "AdamW learning rate, per adapter", within="(0, inf)")

is a field whose default is 5e-4 and whose metadata makes the flag `--lr` (infra/flags.py's
`Parser.add_settings`, which lists the other keys: group, paper, within, choices, metavar,
switch). What it is not: the parser or its checks (infra/flags.py); it imports nothing of the
project, so every concept file may use it.
"""
from __future__ import annotations

import copy
from dataclasses import field


def setting(default, flag: str | tuple[str, ...], help: str, **meta):
    """A settings field: its default, its flag as written (then any other spelling), its help and
    more metadata. A dict default (role=value flags) is copied for each instance."""
    if isinstance(default, dict):  # a mutable default: each instance its own
        return field(default_factory=lambda: copy.deepcopy(default),
                     metadata=dict(flag=flag, help=help, **meta))
    return field(default=default, metadata=dict(flag=flag, help=help, **meta))
