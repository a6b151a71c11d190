"""``/kinds`` and ``/pauses`` over HTTP with a real Celery worker and a dispatcher: a paused kind's flow
started during the pause does not run, a signal sent meanwhile is kept, and the flow finishes after the
resume."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from tests.service.conftest import Served
from tests.waiting import wait_until


@pytest.fixture
def dispatched(live: Served) -> Iterator[Served]:
    dispatcher = Dispatcher(live.engine, interval=0.05).start()
    yield live
    dispatcher.stop()


def whats(served: Served, flow_id: str) -> list[str]:
    return [str(entry.get("what")) for entry in served.engine.history(flow_id)]


def test_a_paused_kinds_flow_waits_keeps_its_signal_and_finishes_after_the_resume(dispatched: Served) -> None:
    http = dispatched.http
    paused = http.post("/kinds/notified/pause", json={"reason": "acquirer maintenance", "by": "ana"})
    assert paused.status_code == 200, paused.text
    assert paused.json()["pause"]["by"] == "api:ana" and paused.json()["paused"]
    started = http.post("/flows/notified?wait=0", json={"orderId": "ord-paused", "token": "tok-paused-0123456789"})
    assert started.status_code == 201, started.text
    flow_id = started.json()["id"]
    # the worker met the pause in its claim: held, logged once, nothing run
    wait_until(lambda: any(what.startswith("held:") for what in whats(dispatched, flow_id)), 15, "the worker to hold the flow")
    record = dispatched.engine.get(flow_id)
    assert record.state is FlowState.READY and "create" not in record.outputs
    assert dispatched.engine.signal(flow_id, "paid", {"by": "card"}, by="api") == "stored", "a signal during the pause is kept"
    kinds = {kind["kind"]: kind for kind in http.get("/kinds").json()["kinds"]}
    assert kinds["notified"]["paused"] and kinds["notified"]["held"] == 1 and not kinds["moto"]["paused"]
    resumed = http.post("/kinds/notified/resume", json={"by": "ana"})
    assert resumed.status_code == 200 and resumed.json()["released"] == 1 and not resumed.json()["paused"]
    done = wait_until(lambda: (r := dispatched.engine.get(flow_id)).state is FlowState.SUCCEEDED and r, 15, "the flow to finish")
    assert done.outputs["payment"]["notification"] == {"by": "card"}, "the signal sent during the pause was read"
    assert [what for what in whats(dispatched, flow_id) if what.startswith(("held:", "released:"))] == [
        "held: flow kind notified paused by api:ana (acquirer maintenance)",
        "released: flow kind notified resumed",
    ]
    log = http.get("/pauses", params={"limit": 2}).json()["pauses"]
    assert [(entry["action"], entry["by"]) for entry in log] == [("resume", "api:ana"), ("pause", "api:ana")]


def test_unknown_kinds_and_a_resume_of_a_running_kind_are_refused(served: Served) -> None:
    headers = {"X-Api-Key": "test-api-key-0123456789"}
    typo = served.http.post("/kinds/notifed/pause", json={"reason": "x"}, headers=headers)
    assert typo.status_code == 404 and "did you mean `notified`" in typo.json()["reason"]
    assert served.http.post("/kinds/moto/resume", headers=headers).status_code == 409
    empty = served.http.post("/kinds/moto/pause", json={"reason": ""}, headers=headers)
    assert empty.status_code == 422 and empty.json()["field"] == "reason"
