"""What verifying an unhappy end costs: the gateway reads, Redis commands and engine CPU of flows that end
failed or cancelled, against flows that succeed and flows declined outright, measured in the same run.

Run: ``.venv/bin/python -m bench.bench_unhappy`` (about a minute). A private Valkey (``appendfsync
always``), the simulator in its own process, and the engine driven in this process, step by step as a
worker would, on a manual clock (so that a late window of 120 s costs no wall time: the figures are work,
not waiting). Per flow, for ``--flows`` MOTO flows of each kind:

* **approved**: answered ``EXECUTED`` (the common case);
* **declined**: answered ``DECLINED``: the gateway's word settles the money at once, nothing is read;
* **lost, then refused**: the first request is answered 500 and never acts, the resends get 429 until the
  attempts are used up: the failure is owed until a read after the late window finds no order
  (docs/durability.md, Money in flight);
* **cancelled while PENDING**: answered ``PENDING``, then the merchant cancels: the read step reads the
  operation (``DECLINED`` here: the flow ends cancelled).

Printed: gateway calls, Redis commands and engine CPU per flow, and each unhappy kind's ratio to the
declined one (an unhappy end that needed no read) and to the approved one.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import httpx
import redis

from bench._harness import Processes, bench_settings, start_simulator, valkey
from durapay.gateway import GatewayClient
from durapay.workflows.engine import CLAIMABLE, Engine, ManualClock
from durapay.workflows.flows import REGISTRY

APPROVE, DECLINE = "4349940199004549", "4349940199997007"


class CountingClient(GatewayClient):
    """The gateway client, counting its calls."""

    calls = 0

    def call(self, *args: Any, **kwargs: Any) -> Any:
        CountingClient.calls += 1
        return super().call(*args, **kwargs)


def drive(engine: Engine, clock: ManualClock, flow_id: str, *, limit: int = 200) -> str:
    """Run the flow's steps as a worker would, moving the clock to each due time, until it stops."""
    for _ in range(limit):
        record = engine.get(flow_id)
        if record.state not in CLAIMABLE:
            return record.state.value
        if record.due is not None and record.due > clock.now():
            clock.advance(record.due - clock.now() + 0.001)
        engine.run_step(flow_id, record.step, worker="bench")
    raise RuntimeError(f"flow {flow_id} did not stop")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flows", type=int, default=100, help="flows of each kind")
    args = parser.parse_args()
    procs = Processes()
    server = valkey()
    try:
        root = start_simulator(procs)
        settings = bench_settings(root, server.url, prefix="unhappy")
        # Each flow meets its 429s alone (the shared limiter would hold them without using attempts): the
        # unhappy end measured is attempts used up.
        settings = settings.model_copy(update={"gateway_health": settings.gateway_health.model_copy(update={"limiter": False})})
        client = redis.Redis.from_url(server.url)
        clock = ManualClock(time.time())
        engine = Engine(settings, client, REGISTRY, clock=clock, client_factory=lambda: CountingClient(settings.gateway))
        admin = httpx.Client(base_url=root, timeout=10)

        def faults(body: dict[str, Any] | None) -> None:
            admin.delete("/_sim/faults").raise_for_status()
            if body:
                admin.post("/_sim/faults", json=body).raise_for_status()

        def moto(n: int, kind: str, pan: str) -> str:
            order = {"orderId": f"u{kind[:3]}{n}", "amount": "1500", "currency": "EUR"}
            card = {"pan": pan, "expiryDate": "1230", "cvv": "123"}
            return engine.start("moto", {"order": order, "card": card}).id

        def approved(n: int) -> str:
            return drive(engine, clock, moto(n, "approved", APPROVE))

        def declined(n: int) -> str:
            return drive(engine, clock, moto(n, "declined", DECLINE))

        verifying: list[int] = []  # per lost flow: the gateway calls made once its failure was owed

        def lost_then_refused(n: int) -> str:
            rules = [
                {"mode": "late", "operation": "create_moto_order", "count": 1},
                {"mode": "error", "operation": "create_moto_order", "status": 429, "count": 20},
            ]
            faults({"rules": rules})
            try:
                flow_id = moto(n, "lost", APPROVE)
                ended = drive(engine, clock, flow_id)
            finally:
                faults(None)
            history = engine.history(flow_id)
            owed = next(i for i, entry in enumerate(history) if "read before the flow fails" in entry["what"])
            verifying.append(sum(1 for entry in history[owed + 1 :] if entry.get("call")))
            return ended

        def cancelled_pending(n: int) -> str:
            admin.post("/_sim/pending", json={"operation": "create_moto_order", "final": "116"}).raise_for_status()
            flow_id = moto(n, "pending", APPROVE)
            engine.run_step(flow_id, "pay", worker="bench")
            engine.cancel(flow_id, "bench")
            admin.post("/_sim/pending/settle", json={}).raise_for_status()
            return drive(engine, clock, flow_id)

        kinds: dict[str, Callable[[int], str]] = {
            "approved": approved,
            "declined": declined,
            "lost, then refused": lost_then_refused,
            "cancelled while PENDING": cancelled_pending,
        }
        rows: dict[str, tuple[float, float, float, str]] = {}
        for name, run in kinds.items():
            CountingClient.calls = 0
            commands = int(client.info("stats")["total_commands_processed"])
            began = time.process_time()
            ends = {run(n) for n in range(args.flows)}
            cpu = (time.process_time() - began) / args.flows * 1000
            spent = (int(client.info("stats")["total_commands_processed"]) - commands) / args.flows
            rows[name] = (CountingClient.calls / args.flows, spent, cpu, "/".join(sorted(ends)))
        print(f"{'flows of each kind':<28}{args.flows}")
        print(f"{'kind':<28}{'ends':<12}{'gateway calls':>15}{'Redis commands':>16}{'engine CPU ms':>15}")
        for name, (calls, commands_per, cpu, ends) in rows.items():
            print(f"{name:<28}{ends:<12}{calls:>15.2f}{commands_per:>16.1f}{cpu:>15.2f}")
        print(
            f"lost, then refused: of its gateway calls, {sum(verifying) / len(verifying):.2f} per flow verify the owed "
            "failure (the rest are the retry policy's reads and resends, as without verification)"
        )
        base, ok = rows["declined"], rows["approved"]
        for name in ("lost, then refused", "cancelled while PENDING"):
            calls, commands_per, cpu, _ = rows[name]
            print(
                f"{name}: gateway calls x{calls / base[0]:.2f}, Redis commands x{commands_per / base[1]:.2f}, "
                f"CPU x{cpu / base[2]:.2f} of a declined flow; CPU x{cpu / ok[2]:.2f} of an approved one"
            )
    finally:
        procs.stop()
        server.stop()


if __name__ == "__main__":
    main()
