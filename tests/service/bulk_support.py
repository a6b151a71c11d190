"""Many flows made quickly for the bulk tests (the CLI's and the console's): started in one batch
(``Engine.start_many``), then each claimed and moved to ``failed`` or ``waiting`` through the engine's own
scripts (claim, then a compare-and-set; each batch in one pipeline), as a step would have left it.
``mit`` flows: their input holds no card data, so a failed one may start again."""

from __future__ import annotations

import uuid

from durapay.service.runtime import Runtime
from durapay.workflows.engine.scripts import ScriptPipeline
from durapay.workflows.engine.states import FlowState
from durapay.workflows.engine.store import Change, ClaimRequest, _taken, compact_json


def make_flows(rt: Runtime, count: int, state: FlowState) -> list[str]:
    engine = rt.engine
    tag = uuid.uuid4().hex[:6]
    starts = [
        ("mit", {"order": {"orderId": f"b{tag}n{index}", "amount": "700", "currency": "EUR"}, "contractId": "ct-bulk"}, None)
        for index in range(count)
    ]
    sender, engine.sender = engine.sender, None  # made here, not sent
    ids = [str(flow_id) for flow_id in engine.start_many(starts)]
    now = engine.clock.now()
    store = engine.store
    # Claims, then compare-and-sets, each batch in one pipeline (the store's own scripts and calls).
    claims = ScriptPipeline(engine.redis)
    for flow_id in ids:
        keys, args = store._claim_call(ClaimRequest(flow_id, "pay", now, now + 60, "test", 5, 50))
        claims.call(store._claim, keys, args)
    moves = ScriptPipeline(engine.redis)
    for answer in claims.execute():
        taken = _taken(answer)
        assert not isinstance(taken, str), taken
        record = taken[1]
        fields: dict[str, str | None] = {"lease_until": None, "lease_owner": None}
        if state is FlowState.FAILED:
            fields["error"] = compact_json({"type": "GatewayUnavailable", "message": "the gateway was down"})
            change = Change(FlowState.FAILED, "pay: gateway unavailable", fields)
        else:
            change = Change(FlowState.WAITING, "pay: waiting", fields, due=now + 3600)
        call = store._transition_call(record, change, now=now, by="test")
        moves.call(store._transition, call.keys, call.args)
    moves.execute()
    engine.sender = sender
    return ids
