"""What a step can end with. The step runner turns each into one atomic update of the flow record.

A step returns (or the runner derives from an error) exactly one of these:

* :class:`Advance` - the step is done; its output is kept and the flow moves to its next step (or
  succeeds when there is none).
* :class:`Finish` - the flow ends now (``failed`` after a decline or a 4xx, with the gateway's error).
* :class:`Retry` - a technical failure; run this step again after ``after`` seconds. ``reconcile``
  says the gateway may have acted, so the next attempt reads the gateway before resending.
* :class:`Poll` - not a failure: the gateway has no final answer yet (a PENDING result); look again.
* :class:`Wait` - the customer must act: wait for one of ``signals`` until ``deadline``.
* :class:`Sleep` - a durable timer: run this step again at ``until``.
* :class:`NewOrder` - the gateway holds an order whose answer was lost before the customer could use
  it (nothing can have been charged); start this step again on a fresh gateway order id.
* :class:`Attention` - only a person can decide; the flow stops in ``needs_attention``.
* :class:`Defer` - the gateway is not to be called now (its breaker is open, or the shared rate limit
  gives this call a later slot): run this step again after ``after`` seconds, using no attempt and no
  run (``workflows.engine.gate``). ``slot`` is the limiter slot reserved for it; ``reconcile`` as for Retry
  (the call that opened the breaker may have reached the gateway).
* :class:`Held` - the step's gateway target (a payment's order, a reservation) is another flow's until its
  money call there is resolved (``workflows.engine.targets``): run this step again once it is (woken then, or
  after ``after`` seconds at the latest), using no attempt and no run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Advance:
    output: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Finish:
    succeeded: bool
    reason: str
    output: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class Retry:
    after: float
    error: dict[str, Any]
    reconcile: bool = False


@dataclass(frozen=True)
class Poll:
    after: float
    note: str = ""


@dataclass(frozen=True)
class Wait:
    """Wait for one of ``signals`` until ``deadline``, then run the step's read. ``ends``: when what the
    flow waits on stops being payable, if later than ``deadline`` (an open link read at a pace before
    its expiry, ``workflows.flows.waits``): the record is kept that long (``workflows.engine.inflight``)."""

    signals: tuple[str, ...]
    deadline: float
    note: str = ""
    ends: float | None = None


@dataclass(frozen=True)
class Sleep:
    until: float
    note: str = ""


@dataclass(frozen=True)
class NewOrder:
    reason: str


@dataclass(frozen=True)
class Attention:
    reason: str
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class Defer:
    after: float
    reason: str
    error: dict[str, Any]
    reconcile: bool = False
    slot: float | None = None


@dataclass(frozen=True)
class Held:
    after: float
    reason: str
    error: dict[str, Any]


Outcome = Advance | Finish | Retry | Poll | Wait | Sleep | NewOrder | Attention | Defer | Held
