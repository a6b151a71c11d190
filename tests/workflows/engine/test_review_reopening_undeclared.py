"""Review 2: a call step's body reopens a payable link (``renew_paybylink``, ``modify_paybylink_v3`` with a new
expiry) while the step declares a read. Neither operation is marked ``moves_money`` or ``notifies`` in the
catalogue (gateway/_catalogue.py:169-170), so ``StepContext._check_declared`` never runs for them
(tasks/runner.py:237): the link is payable again with no money in flight marked, no holder told, no keep.
The built-in renewal (``paybylink_renew``) tells the holder only through ``FlowDefinition.tells_holder``;
a merchant's definition sending the same call is not stopped, and a payment on the reopened link of an
ended flow shows in no flow once that flow's retention ends (invariants 1 and 2)."""

from __future__ import annotations

from typing import Any

import pytest

from durapay.flows import Flow, call
from durapay.gateway import Catalogue
from durapay.workflows.engine.states import FlowState
from tests.workflows.engine.test_steps_review import DroppedGateway
from tests.workflows.engine_support import DemoInput, ScriptedStep, summary


@pytest.mark.parametrize(
    ("sent", "request_body"),
    [
        (Catalogue.renew_paybylink, {"expirationDate": "2099-01-01"}),
        (Catalogue.modify_paybylink_v3, {"expirationDate": "2099-01-01"}),
    ],
    ids=["renew", "modify-expiry"],
)
def test_a_read_step_cannot_reopen_a_payable_link(make_engine: Any, sent: Any, request_body: dict[str, Any]) -> None:
    gateway = DroppedGateway()

    def reopen(ctx: Any, send: Any) -> Any:
        return ctx.call(sent, "L-of-an-ended-flow", request=request_body)

    look = call("look", Catalogue.get_order, body=reopen)
    definition = Flow("demo", DemoInput, (look, ScriptedStep("after")), summary)
    engine, _ = make_engine(definition, client_factory=lambda *args, **kwargs: gateway)
    record = engine.start("demo", {"amount": 3})
    engine.run_step(record.id, "look")
    stopped = engine.get(record.id)
    assert gateway.sent == [], (
        f"{sent.name} (makes a link payable again) sent by a step declared as get_order, unrefused; "
        f"flow {stopped.state.value}, unsettled={stopped.unsettled}"
    )
    assert stopped.state is FlowState.NEEDS_ATTENTION and (stopped.error or {}).get("type") == "UndeclaredMoney"
