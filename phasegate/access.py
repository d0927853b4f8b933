"""Access policy: which roles may read the state a phase committed, and the access log.

``PHASEGATE_READ_POLICY`` is a JSON object from a phase to the roles allowed to read the state
its checkpoints hold::

    {"storm-intel.ingest": ["analyst"], "storm-intel.*": ["ops", "analyst"], "*": ["auditor"]}

The most specific key wins (``workflow.phase``, then ``workflow.*``, then ``*``); a role
``"*"`` admits any caller. With a policy set, a phase no key covers is readable by nobody;
with no policy, state is readable by any caller (the single-tenant default) -- and every read
is still logged.

Enforced in the read path the API and CLI share (``orchestrator/views.py`` calls
``enforce``): each checkpoint's state is kept or withheld per its phase, and every read and
every denial is appended to ``access_log`` (append-only: the database refuses UPDATE, DELETE
and TRUNCATE) in the same round trip's worth of work -- one INSERT per request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from phasegate.sql import queries

ROLE_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
ANY = "*"
RESOURCE = "checkpoint_state"


class AccessDenied(Exception):
    """The caller's role may not read what it asked for (the API answers 403)."""


@dataclass(frozen=True)
class ReadPolicy:
    rules: Mapping[str, frozenset[str]]

    def roles_for(self, workflow: str, phase: str) -> frozenset[str]:
        for key in (f"{workflow}.{phase}", f"{workflow}.*", ANY):
            if key in self.rules:
                return self.rules[key]
        return frozenset()

    def decide(self, held: Collection[str] | None, workflow: str,
               phase: str) -> tuple[bool, str]:
        """(allowed, reason) for a caller holding the roles ``held`` -- the reason names roles
        and the phase, never data."""
        roles = self.roles_for(workflow, phase)
        if ANY in roles:
            return True, "policy admits any role"
        if not held:
            return False, f"no role given; {workflow}.{phase} is readable by {sorted(roles)}"
        granted = sorted(set(held) & roles)
        if granted:
            return True, f"role {granted[0]} may read {workflow}.{phase}"
        return False, (f"roles {sorted(held)} may not read {workflow}.{phase} "
                       f"(allowed: {sorted(roles)})")


def parse_policy(text: str) -> ReadPolicy:
    """``PHASEGATE_READ_POLICY`` -> ReadPolicy; raises ValueError saying what is wrong."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError('must be a JSON object like {"workflow.phase": ["role", ...], '
                         '"*": ["role"]}') from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object of phase -> list of roles")
    rules: dict[str, frozenset[str]] = {}
    for key, roles in raw.items():
        if key != ANY and (key.count(".") < 1 or not all(key.rpartition(".")[::2])):
            raise ValueError(f"key {key!r} must be 'workflow.phase', 'workflow.*' or '*'")
        if not isinstance(roles, list) or not all(
                isinstance(r, str) and (r == ANY or ROLE_PATTERN.fullmatch(r)) for r in roles):
            raise ValueError(f"the roles of {key!r} must be a list of role names "
                             "([A-Za-z0-9_.:-], or '*' for any)")
        rules[key] = frozenset(roles)
    return ReadPolicy(rules)


def parse_service_accounts(text: str) -> dict[str, frozenset[str]]:
    """``PHASEGATE_API_SERVICE_ACCOUNTS``: {"NAMESPACE:NAME": ["role", ...]}, the roles the
    orchestrator's ``kubernetes`` authentication gives each ServiceAccount."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError('must be a JSON object like {"namespace:serviceaccount": '
                         '["operator"]}') from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object of 'namespace:serviceaccount' -> roles")
    accounts: dict[str, frozenset[str]] = {}
    for key, roles in raw.items():
        if not isinstance(key, str) or key.count(":") != 1 or not all(key.split(":")):
            raise ValueError(f"key {key!r} must be 'namespace:serviceaccount'")
        if not isinstance(roles, list) or not roles or not all(
                isinstance(r, str) and ROLE_PATTERN.fullmatch(r) for r in roles):
            raise ValueError(f"the roles of {key!r} must be a non-empty list of role names")
        accounts[key] = frozenset(roles)
    return accounts


def policy_from(text: str | None) -> ReadPolicy | None:
    return parse_policy(text) if text else None


def check_role(role: str | None) -> str | None:
    if role is not None and not ROLE_PATTERN.fullmatch(role):
        raise AccessDenied("a role is 1-64 chars of [A-Za-z0-9_.:-]")
    return role


def _attr(item: Any, name: str) -> Any:
    return item[name] if isinstance(item, dict) else getattr(item, name)


async def enforce(pool: asyncpg.Pool, policy: ReadPolicy | None, *, workflow_id: str,
                  workflow: str, items: Sequence[Any], roles: Collection[str] | None,
                  actor: str | None) -> list[bool]:
    """Decide each checkpoint's state read, log every decision, return what was allowed.

    The log's ``role`` column holds the caller's roles, comma-separated, and ``actor`` the
    caller's name (the API token's NAME).

    The caller withholds the state of every item whose entry is False. Nothing is returned
    before the log rows are committed: a read that cannot be logged is not served."""
    allowed: list[bool] = []
    phases, seqs, branches, decisions, reasons = [], [], [], [], []
    for item in items:
        phase = str(_attr(item, "phase"))
        ok, reason = (True, "no read policy configured") if policy is None \
            else policy.decide(roles, workflow, phase)
        allowed.append(ok)
        phases.append(phase)
        seqs.append(int(_attr(item, "seq")))
        branches.append(str(_attr(item, "branch")))
        decisions.append("read" if ok else "denied")
        reasons.append(reason)
    role = ",".join(sorted(roles)) if roles else None
    if items:
        await pool.execute(queries("governance.sql")["access_log_append"], workflow_id,
                           workflow, role, phases, seqs, branches, decisions, reasons, actor)
    return allowed


async def access_log(pool: asyncpg.Pool, workflow_id: str) -> list[dict[str, Any]]:
    rows = await pool.fetch(queries("governance.sql")["access_log_for_run"], workflow_id)
    return [dict(r) for r in rows]
