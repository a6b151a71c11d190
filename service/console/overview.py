"""What the console's home shows: flows by state, those needing a person, recent declines, throughput,
step latency and the health of the parts. Every figure is a few cheap reads (ZCARD, ZCOUNT, the
metrics hashes workers already keep): the home page and its live JSON cost the same with a million
flows as with ten.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from durapay.service.api_ops import readiness
from durapay.service.metrics import step_totals
from durapay.workflows.engine import TERMINAL, Engine, FlowRecord, FlowState, mask_text
from durapay.workflows.listing import FlowListing

#: How far back "recent" reaches for throughput (seconds).
WINDOW = 60.0


def reason_of(record: FlowRecord) -> str:
    """One line saying why a flow stopped (its error's type and message, or its outcome's reason), card
    numbers masked (a person's reason may hold one)."""
    return mask_text(_reason(record), record.identifiers)


def _reason(record: FlowRecord) -> str:
    error = record.error or {}
    if error.get("type") == "LatePayment":
        operation = error.get("operation") or {}
        return (
            f"LatePayment: the gateway reports {operation.get('operationResult')} of operation "
            f"{operation.get('operationId')} while the flow ended {error.get('endedAs')}"
        )
    if error:
        text = str(error.get("message") or error.get("reason") or "")
        return f"{error.get('type') or 'error'}: {text}".strip(": ")
    return str((record.outcome or {}).get("reason") or "")


def attention(listing: FlowListing, limit: int = 20) -> list[FlowRecord]:
    """The newest ``needs_attention`` flows, late payments first."""
    records = listing.page(states=[FlowState.NEEDS_ATTENTION], limit=limit).records
    return sorted(records, key=lambda record: (0 if (record.error or {}).get("type") == "LatePayment" else 1, -record.updated))


def declines(listing: FlowListing, sample: int = 200) -> list[tuple[str, str, int]]:
    """The latest ``sample`` failed flows grouped by (ISO response code, soft/hard), most frequent first."""
    counted: Counter[tuple[str, str]] = Counter()
    for record in listing.page(states=[FlowState.FAILED], limit=sample).records:
        error = record.error or {}
        code = str(error.get("responseCode") or error.get("status") or error.get("type") or "?")
        counted[(code, str(error.get("decline") or "-"))] += 1
    return [(code, kind, n) for (code, kind), n in counted.most_common(10)]


def throughput(engine: Engine, now: float) -> dict[str, int]:
    """Flows that ended per terminal state in the last ``WINDOW`` seconds."""
    pipe = engine.redis.pipeline(transaction=False)
    states = sorted(state.value for state in TERMINAL)
    for state in states:
        for partition in range(engine.keys.partitions):
            pipe.zcount(engine.keys.by_state(partition, state), now - WINDOW, "+inf")
    answers = iter(pipe.execute())
    return {state: sum(int(next(answers)) for _ in range(engine.keys.partitions)) for state in states}


def step_latency(engine: Engine) -> list[dict[str, Any]]:
    """Per (kind, step): how many ran, their mean time, and their technical retries (``/metrics``' data)."""
    rows = step_totals(engine)
    out = []
    for (kind, step), values in sorted(rows.items()):
        count = values.get("count", 0.0)
        mean = values.get("sum", 0.0) / count if count else 0.0
        retries = int(values.get("retries", 0))
        out.append({"kind": kind, "step": step, "count": int(count), "mean_ms": round(mean * 1000, 1), "retries": retries})
    return out


def snapshot(engine: Engine, listing: FlowListing, now: float) -> dict[str, Any]:
    """The live part of the home page (its JSON endpoint answers this)."""
    return {
        "states": listing.count(),
        "ended_last_minute": throughput(engine, now),
        "health": readiness(engine),
    }
