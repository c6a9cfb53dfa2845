"""Role names: a call is named by its role type, plus an instance number when a workflow runs
several in parallel.

What it is for: the one place that reads a call's role type from its name (`generator0` ->
`generator`), for the workflows (`Call.role`, per-role metrics), the adapter routing
(policies.route_adapter: under IP an adapter per role type) and the toy world's oracle
(toyworld/toy.py). What it is not: which roles a workflow has (workflows.ROLES).

    python -c "from infra.roles import role_type; print(role_type('generator0'))"   # generator
"""
from __future__ import annotations

import re


def role_type(call_name: str) -> str:
    """The role a call plays, its instance digits stripped: generator0 -> generator."""
    return re.sub(r"\d+$", "", call_name)
