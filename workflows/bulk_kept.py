"""A bulk dry run kept for its confirmation, and what a confirmation must match to act on it.

A person's confirmation acts on exactly what it showed (DESIGN, money invariant 8): the dry run
(``workflows.bulk_plan``) is kept here, its view (what it showed: the sample with each flow's money, the
totals, the skips, its filter as asked and as resolved) and its flows, each as it was shown
(``bulk_plan.entry``: id, version, state; about 40 bytes a flow, at most ``DURAPAY_BULK__MAX_FLOWS``), for
:data:`~durapay.workflows.bulk_plan.KEPT_SECONDS`, in the hash slot of the action its token names
(``workflows.bulk`` writes that action's record beside it and drops the dry run in the same transaction).

Its token names its action and filter: a confirmation with another action or another filter as asked
(``since=1h`` is matched as written, its time fixed at the dry run) is refused, and so is a token no
longer kept (:class:`Unconfirmable`, a 409 on every surface).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from durapay.workflows.bulk_plan import FILTERS, KEPT_SECONDS, Action, Plan, entry
from durapay.workflows.engine import compact_json, derived_id, mask


class Unconfirmable(ValueError):
    """A confirmation that cannot act as asked (a 409 on every surface): say why and what to do."""


class KeyReused(Unconfirmable):
    """A key given with another action or filter than the action first posted under it, or a dry run's token
    with another action or filter than the dry run's."""


class PlanNotKept(Unconfirmable):
    """A dry run's token that is not kept (past ``KEPT_SECONDS``, never made, or confirmed under another key)."""


def plan_action_id(token: str) -> str:
    """The id of the action that confirms the dry run ``token`` (without a key of its own)."""
    return derived_id("b", "plan", token)


def asked_text(action: Action, given: Mapping[str, Any]) -> str:
    """The action and its filter as asked, in one form (what a key or a dry run's token is compared by), its
    text masked as it is kept (``workflows.engine.sensitive``: a card number typed in a filter is never kept whole)."""
    return compact_json(mask({"action": action, **{name: str(value) for name, value in given.items() if value is not None}}))


def words(action: Action, given: Mapping[str, Any]) -> str:
    """``retry of kind=mit, state=failed`` (``retry of every flow`` with no filter)."""
    shown = ", ".join(f"{name}={given[name]}" for name in FILTERS if given.get(name) is not None)
    return f"{action} of {shown or 'every flow'}"


class KeptPlans:
    """Dry runs kept in Redis for their confirmation (keys ``{b:<action id>}:bulk_plan`` and ``:bulk_plan_ids``)."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix

    def key(self, token: str) -> str:
        return f"{self.prefix}:{{b:{plan_action_id(token)}}}:bulk_plan"

    def ids_key(self, token: str) -> str:
        return f"{self.prefix}:{{b:{plan_action_id(token)}}}:bulk_plan_ids"

    def keep(self, plan: Plan) -> None:
        """Keep ``plan`` for :data:`KEPT_SECONDS` (its view and its flows as shown), in one transaction."""
        pipe = self.redis.pipeline(transaction=True)
        entries = [entry(flow_id, seen) for flow_id, seen in plan.flows if seen is not None]
        for start in range(0, len(entries), 1000):
            pipe.rpush(self.ids_key(plan.token), *entries[start : start + 1000])
        pipe.expire(self.ids_key(plan.token), KEPT_SECONDS)
        pipe.set(self.key(plan.token), compact_json(plan.view()), ex=KEPT_SECONDS)
        pipe.execute()

    def get(self, token: str) -> Plan | None:
        """The dry run of that token as it was made (its flows, each as it was shown; what it showed), or
        None when it is not kept (past ``KEPT_SECONDS``, never made, or confirmed already)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(self.key(token))
        pipe.lrange(self.ids_key(token), 0, -1)
        view, entries = pipe.execute()
        if view is None:
            return None
        return Plan.kept(json.loads(view), [raw.decode() for raw in entries])

    def confirms(self, token: str, action: Action, given: Mapping[str, Any]) -> Plan:
        """The kept dry run ``token`` if it is of this action and filter (as asked); :class:`PlanNotKept`,
        or :class:`KeyReused` naming what it was made for."""
        found = self.get(token)
        if found is None:
            raise PlanNotKept(
                f"the dry run {token} is not kept (a dry run is kept {KEPT_SECONDS // 60} minutes for its "
                "confirmation, and confirmed once): make a new dry run"
            )
        if asked_text(found.action, found.asked) != asked_text(action, given):
            raise KeyReused(
                f"the dry run {token} was made for {words(found.action, found.asked)}, not for "
                f"{words(action, given)}: make a dry run of this one"
            )
        return found
