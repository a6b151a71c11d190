"""Celery tasks: one per gateway operation (``durapay.gateway.<operation>``), derived from the catalogue.

Each task runs one step of one flow: ``task(flow_id, step)`` runs that step through the engine's step
runner (claim, call with the step's idempotency key, classify, complete). A duplicate or late delivery
finds the step claimed or done and returns without calling the gateway.

The tasks are internal: their messages carry a flow id and a step name, nothing else. They once also
took a gateway request directly (``task.delay(request={...})``): a request carrying a card then
crossed the broker, and stayed in its Redis's files, in the clear, past the card data's sealing
(``workflows.engine.cards``). Such a call is now refused by Celery's argument check before anything is sent
(a TypeError in the caller); a gateway call outside a flow is made in the caller's own process
(``durapay.gateway.GatewayClient``), never through the broker.

``durapay.engine.step`` runs the steps that call nothing (waits, timers). ``CelerySender`` is how the
engine sends work: one task, or a chain of the remaining steps of a flow (the chain is the fast path;
the engine's due set is the safety net when a link is lost).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from celery import Celery, chain

from durapay.config.celery import QUEUE, WEBHOOK_QUEUE
from durapay.gateway import CATALOGUE, GatewayOperation

ENGINE_STEP_TASK = "durapay.engine.step"
WEBHOOK_TASK = "durapay.webhooks.deliver"
BULK_TASK = "durapay.bulk.run"


class StepRunner(Protocol):
    def __call__(
        self, flow_id: str, step: str, /, *, worker: str, chained_next: str | None, money: bool | None, follow: int
    ) -> str: ...


def _next_link(request: Any, flow_id: str) -> str | None:
    """The step name of the chain's next link for this flow, if the chain still has one."""
    links = getattr(request, "chain", None) or []
    if not links:
        return None
    following = links[-1]  # Celery keeps the remaining links reversed
    args = following.get("args") or []
    if len(args) >= 2 and args[0] == flow_id:
        return str(args[1])
    return None


def register_tasks(app: Celery, run_step: StepRunner, *, follow: int = 0) -> None:
    """Define every task on ``app``. ``run_step`` is the engine's; ``follow``: how many of a flow's next
    steps, due at once, a task runs itself after its own (``DURAPAY_ENGINE__FOLLOW_STEPS``)."""

    def make(op: GatewayOperation[Any]) -> None:
        # typing=True (Celery's default, kept explicit): a call with other arguments is refused before it is sent.
        @app.task(name=op.task_name, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True, typing=True)  # type: ignore[untyped-decorator]
        def gateway_task(self: Any, flow_id: str, step: str) -> str:
            # A write at the gateway (a payment, a refund...): its claim is made durable at once.
            money = op.method == "POST"
            next_link = _next_link(self.request, flow_id)
            worker = self.request.hostname or ""
            return run_step(flow_id, step, worker=worker, chained_next=next_link, money=money, follow=follow)

    for op in CATALOGUE:
        make(op)

    @app.task(name=ENGINE_STEP_TASK, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True)  # type: ignore[untyped-decorator]
    def engine_step(self: Any, flow_id: str, step: str) -> str:
        next_link = _next_link(self.request, flow_id)
        worker = self.request.hostname or ""
        return run_step(flow_id, step, worker=worker, chained_next=next_link, money=False, follow=follow)


def register_webhook_task(app: Celery, deliver: Callable[[str, list[str]], Any]) -> None:
    """``durapay.webhooks.deliver(stream tag, deliveries)``: one attempt of each of a few webhook
    deliveries of one endpoint (``workflows.webhooks``). Each stays on the due set until its attempt is
    recorded, so a lost task or a killed worker only delays it."""

    @app.task(name=WEBHOOK_TASK, shared=False, acks_late=True, reject_on_worker_lost=True, ignore_result=True)  # type: ignore[untyped-decorator]
    def deliver_webhook(tag: str, members: list[str] | str) -> None:
        deliver(tag, [members] if isinstance(members, str) else list(members))


def register_bulk_task(app: Celery, run: Callable[[str], bool], send: Callable[[str], None]) -> None:
    """``durapay.bulk.run(bulk id)``: act on a bulk action's flows for a while (``workflows.bulk``), then
    send itself again while work is left. A lost task only delays the action: the dispatcher sends the
    runner of an action whose progress stopped."""

    @app.task(name=BULK_TASK, shared=False, acks_late=True, ignore_result=True)  # type: ignore[untyped-decorator]
    def run_bulk(bulk_id: str) -> None:
        if run(bulk_id):
            send(bulk_id)


class CelerySender:
    """Sends step tasks by name (the sending process need not have the tasks registered)."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def send(self, task_name: str, flow_id: str, step: str, *, queue: str = QUEUE) -> None:
        self.app.send_task(task_name, args=[flow_id, step], queue=queue)

    def send_webhook(self, tag: str, members: list[str]) -> None:
        # Their own queue, consumed by delivery workers only: a slow endpoint never holds a step's thread.
        self.app.send_task(WEBHOOK_TASK, args=[tag, members], queue=WEBHOOK_QUEUE)

    def send_bulk(self, bulk_id: str) -> None:
        self.app.send_task(BULK_TASK, args=[bulk_id], queue=QUEUE)

    def send_chain(self, flow_id: str, links: Sequence[tuple[str, str]], *, queue: str = QUEUE) -> None:
        """``links`` = [(task name, step name), ...] in order, every link on ``queue`` (the flow's fairness
        queue, ``workflows.engine.fairness``, when fairness is on)."""
        if not links:
            return
        if len(links) == 1:
            self.send(links[0][0], flow_id, links[0][1], queue=queue)
            return
        signatures = [self.app.signature(name, args=(flow_id, step), immutable=True, queue=queue) for name, step in links]
        chain(*signatures).apply_async()
