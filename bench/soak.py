"""The soak: a steady mixed load with short retentions, then a wait past them; everything durapay keeps must
come back (issue 29; docs/operations.md, "What durapay keeps").

Run: ``.venv/bin/python -m bench.soak`` (defaults: 5 minutes at 10 flows a second, every retention at two
minutes; the issue's soak was ``--duration 1200 --rate 15``). It starts what ``durapay chaos`` starts
(``service.chaos.stack``: its own Valkey with AOF, the simulator, the receiver, a scheduler and two
workers as processes) with no faults, and:

1. measures every key family (keys of one name pattern: ``flow``, ``log``, ``op``, ``events``,
   ``schedule_log``, Celery's...) at the **baseline** (the stack up, nothing run yet): how many keys, how
   many entries they hold (a sorted set's members, a stream's or list's entries, a hash's fields) and
   their memory (``MEMORY USAGE``), and each process's resident memory;
2. runs the load for ``--duration``: card payments (MOTO sales, some refunded, authorizations then
   captured), card verifications, wallet, SVS and 3-step payments, two webhook endpoints subscribed to
   every event, and ``--schedules`` schedules (created with a key) charging a contract every minute
   ``--charges`` times, cancelled when the load ends if still going; it samples the families every
   ``--sample`` seconds and keeps each one's **peak**;
3. waits for every flow to end, then past the retentions until every family is back (or ``--patience``
   runs out), and measures **after retention**.

It prints a table (family, then keys / entries / KiB at baseline, peak and after) and each process's
memory growth per 1,000 flows over the second half of the load, and exits 1 when a family stays above its
baseline (those bounded by a count instead are listed with their bound, ``BOUNDED``). ``--json`` prints
the same as JSON.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._webhook_receiver import WebhookReceiver
from durapay.config import load_settings
from durapay.service.chaos.stack import ChaosStack
from durapay.workflows.engine import TERMINAL, Engine, FlowState
from durapay.workflows.schedules import Schedules

APPROVE = "4349940199004549"
#: Families bounded by a count, not by time: name -> the bound (they may stay above the baseline, within it).
BOUNDED = {
    "whk:attempts": "DURAPAY_WEBHOOKS__ATTEMPTS_KEPT attempts per endpoint and partition",
    "whk:cursor": "one fan-out cursor per stream",
    "webhooks:endpoints": "one entry per endpoint",
    "webhooks:failing": "one entry per failing endpoint",
    "count": "one counter per metric (and one per minute of unknown-order events, for 120 s)",
    "metrics": "one field per metric and label",
    "alive": "one heartbeat per role",
    "celery:_kombu": "Celery's bindings: one per queue",
    # Kept, not expired once clean: its counters are the totals /metrics shows (deferred, 429s, waits,
    # breaker openings, probes), which an expiry would reset; the limiter's slot and a 429's hold are in it.
    "gate": "one hash per gateway terminal, its fields a fixed set (breaker, limiter slot, 429 hold, counters)",
}
#: Families of one key per partition (a stream, a due set, an index): judged by their entries only.
PER_PARTITION = frozenset(
    {"events", "due", "state", "kind", "finished", "schedule_due", "schedule_state", "schedules", "schedule_ended"}
    | {"whk:due", "whk:state"}
)
#: A task id at the end of a Celery key's name (``celery-task-meta-<uuid>``): the family is the rest.
_ID = re.compile(r"[:-]?[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def family(key: str, prefix: str) -> str:
    """The family of a key: its first name after the prefix and partition tag (``flow``, ``state``...), or
    for a key outside durapay's prefix (Celery's) its name without an id."""
    if key.startswith(prefix + ":"):
        parts = key[len(prefix) + 1 :].split(":")
        if parts[0].startswith("{"):
            parts = parts[1:]
        if parts[0] in ("whk", "webhooks") and len(parts) > 1:
            return ":".join(parts[:2])
        return parts[0] if parts else "?"
    name = _ID.sub("", key)
    return "celery:_kombu" if name.startswith("_kombu") else "celery:" + name


@dataclass
class Size:
    keys: int = 0
    entries: int = 0
    memory: int = 0

    def above(self, other: Size, *, per_partition: bool = False) -> bool:
        return (self.keys > other.keys and not per_partition) or self.entries > other.entries

    def row(self) -> str:
        return f"{self.keys:>7} {self.entries:>8} {self.memory / 1024:>9.1f}"


_LENGTH = {b"zset": "zcard", b"stream": "xlen", b"list": "llen", b"set": "scard", b"hash": "hlen", b"string": None}


def measure(client: Any, prefix: str) -> dict[str, Size]:
    """Every family's keys, entries and memory, in batches of pipelined commands (SCAN, TYPE, length,
    MEMORY USAGE)."""
    found: dict[str, Size] = {}
    keys = [key.decode() for key in client.scan_iter(count=2000)]
    for start in range(0, len(keys), 1000):
        batch = keys[start : start + 1000]
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.type(key)
            pipe.memory_usage(key)
        answers = pipe.execute()
        kinds = answers[0::2]
        pipe = client.pipeline(transaction=False)
        for key, kind in zip(batch, kinds, strict=True):
            length = _LENGTH.get(kind)
            if length:
                getattr(pipe, length)(key)
            else:
                pipe.exists(key)
        lengths = pipe.execute()
        for key, memory, length in zip(batch, answers[1::2], lengths, strict=True):
            size = found.setdefault(family(key, prefix), Size())
            size.keys += 1
            size.entries += int(length or 0)
            size.memory += int(memory or 0)
    return found


def rss(pid: int) -> int:
    """A process's resident memory in bytes (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Soak:
    stack: ChaosStack
    engine: Engine
    schedules: Schedules
    rng: random.Random
    prefix: str
    started: list[str] = field(default_factory=list)
    parents: list[tuple[str, str, int]] = field(default_factory=list)  # (flow id, follow-up, amount)
    number: int = 0

    def processes(self) -> dict[str, int]:
        found = {"api+simulator (this process)": rss(os.getpid())}
        for child in [*self.stack.workers, *([self.stack.scheduler] if self.stack.scheduler else [])]:
            if child.process is not None:
                found[child.name] = rss(child.process.pid)
        return found

    def start(self, kind: str, body: dict[str, Any], follow: str = "") -> None:
        self.number += 1
        record = self.engine.start(kind, body, key=f"soak-{self.number}")
        self.started.append(record.id)
        if follow:
            self.parents.append((record.id, follow, int(body["order"]["amount"])))

    def one(self) -> None:
        """One flow of the mix (seeded)."""
        amount = 1000 + self.rng.randrange(0, 5000, 10)
        order = {"orderId": f"sk{self.number}", "amount": str(amount), "currency": "EUR"}
        card = {"pan": APPROVE, "expiryDate": "1230", "cvv": "123"}
        draw = self.rng.random()
        if draw < 0.3:
            self.start("moto", {"order": order, "card": card}, "refund" if self.rng.random() < 0.5 else "")
        elif draw < 0.5:
            self.start("moto", {"order": order, "card": card, "captureType": "EXPLICIT"}, "capture")
        elif draw < 0.6:
            self.start("card_verification", {"order": {**order, "amount": "0"}, "card": card})
        elif draw < 0.7:
            self.start("wallet", {"order": order, "walletPaymentData": {"pan": APPROVE}})
        elif draw < 0.85:
            self.start("svs", {"order": order, "card": card})
        else:
            self.start("three_steps", {"order": order, "card": card})

    def follow_ups(self) -> None:
        """Refund or capture the parents that succeeded (at most a batch per call)."""
        waiting = []
        for record in self.engine.store.many(flow_id for flow_id, _, _ in self.parents[:200]):
            follow, amount = next((f, a) for i, f, a in self.parents if i == record.id)
            if record.state is FlowState.SUCCEEDED:
                operation = str(((record.outcome or {}).get("operation") or {}).get("operationId") or "")
                if operation:
                    self.number += 1
                    body = {"operationId": operation, "amount": amount // 2 if follow == "refund" else amount, "currency": "EUR"}
                    self.started.append(self.engine.start(follow, body, key=f"soak-{self.number}").id)
            elif record.state not in TERMINAL:
                waiting.append(record.id)
        seen = {flow_id for flow_id, _, _ in self.parents[:200]}
        self.parents = [p for p in self.parents if p[0] in waiting or p[0] not in seen]

    def unfinished(self) -> int:
        return sum(1 for record in self.engine.store.many(self.started[-2000:]) if record.state not in TERMINAL)


def contract(soak: Soak, tag: str) -> str:
    """A scheduled contract, made by a 3-step payment (the schedules charge it)."""
    contract_id = f"{tag}-contract"
    body = {
        "order": {"orderId": f"{tag}c", "amount": "100", "currency": "EUR", "customerId": f"{tag}-cust"},
        "card": {"pan": APPROVE, "expiryDate": "1230", "cvv": "123"},
        "recurrence": {"action": "CONTRACT_CREATION", "contractId": contract_id, "contractType": "MIT_SCHEDULED"},
    }
    record = soak.engine.start("three_steps", body, key=f"{tag}-contract")
    deadline = time.monotonic() + 60
    while soak.engine.get(record.id).state not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
    return contract_id


def secret() -> str:
    return "whsec_" + base64.b64encode(random.Random(7).randbytes(24)).decode()


def run(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    retention = args.retention
    hooks = [WebhookReceiver().up() for _ in range(2)]
    for hook in hooks:
        hook.secrets.append(secret())
    overrides: dict[str, dict[str, Any]] = {
        "engine": {"retention": retention},
        "events": {"retention": retention},
        "schedules": {"retention": retention, "history_entries": args.history},
        "receiver": {"event_ttl_seconds": retention},
        "webhooks": {
            "allow_private": True,
            "retry_days": 5 / 86400,
            "retry_delays": [0, 1, 2],
            "endpoints": [{"url": hook.url, "secret": hook.secrets[0]} for hook in hooks],
        },
    }
    folder = Path(tempfile.mkdtemp(prefix="durapay-soak-"))
    stack = ChaosStack(load_settings(), folder, seed=args.seed, redis_url=None, lose_last_writes=False, overrides=overrides)
    try:
        stack.start(say)
        assert stack.runtime is not None
        engine = stack.runtime.engine
        prefix = engine.keys.prefix
        soak = Soak(stack, engine, Schedules(engine), random.Random(args.seed), prefix)
        alive = [engine.keys.heartbeat("scheduler")]
        deadline = time.monotonic() + 60
        while not (all(engine.redis.exists(key) for key in alive) and engine.redis.keys(f"{prefix}:alive:worker*")):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the scheduler or the workers did not start (logs in {stack.log_dir})")
            time.sleep(0.2)
        baseline, memory0 = measure(engine.redis, prefix), soak.processes()
        say(f"baseline: {sum(s.keys for s in baseline.values())} keys; load for {args.duration:g}s at {args.rate:g}/s")
        schedules = []
        if args.schedules:
            contract_id = contract(soak, f"sk{args.seed}")
            for n in range(args.schedules):
                spec = {"contractId": contract_id, "amount": 500 + n, "currency": "EUR", "description": "soak"}
                schedules.append(
                    soak.schedules.create(
                        {**spec, "rule": {"cron": "* * * * *"}, "start": "2020-01-01", "count": args.charges, "missed": "skip"},
                        key=f"soak-{args.seed}-{n}-{time.time_ns()}",
                    ).id
                )
        peak = {name: Size(**vars(size)) for name, size in baseline.items()}
        began = time.monotonic()
        next_sample, half, memory_half = began + args.sample, None, memory0
        trend: list[tuple[int, dict[str, int]]] = []  # (flows started, each process's memory) at each sample
        while (elapsed := time.monotonic() - began) < args.duration:
            owed = int(elapsed * args.rate) - len(soak.started)
            for _ in range(max(0, min(owed, 50))):
                soak.one()
            soak.follow_ups()
            if half is None and elapsed >= args.duration / 2:
                half, memory_half = len(soak.started), soak.processes()
            if time.monotonic() >= next_sample:
                next_sample += args.sample
                trend.append((len(soak.started), soak.processes()))
                for name, size in measure(engine.redis, prefix).items():
                    top = peak.setdefault(name, Size())
                    top.keys, top.entries, top.memory = (
                        max(top.keys, size.keys),
                        max(top.entries, size.entries),
                        max(top.memory, size.memory),
                    )
            time.sleep(0.02)
        flows, memory_end = len(soak.started), soak.processes()
        for schedule_id in schedules:  # the load is over: a schedule still going ends (then its retention runs)
            with contextlib.suppress(Exception):
                soak.schedules.cancel(schedule_id, "the soak's load ended")
        say(f"{flows} flows started; waiting for them to end, then past the retentions ({retention})")
        deadline = time.monotonic() + 120
        while (soak.parents or soak.unfinished()) and time.monotonic() < deadline:
            soak.follow_ups()
            time.sleep(0.5)
        flows = len(soak.started)
        deadline = time.monotonic() + args.patience
        while True:
            after = measure(engine.redis, prefix)
            failing = [
                name
                for name, size in after.items()
                if name not in BOUNDED and size.above(baseline.get(name, Size()), per_partition=name in PER_PARTITION)
            ]
            if not failing or time.monotonic() > deadline:
                break
            time.sleep(2)
        second_half = max(1, flows - (half or 0))
        growth = {name: (memory_end.get(name, 0) - memory_half.get(name, 0)) / second_half * 1000 for name in memory_end}
        return {
            "flows": flows,
            "duration": args.duration,
            "retention": retention,
            "families": {
                name: {
                    "baseline": vars(baseline.get(name, Size())),
                    "peak": vars(peak.get(name, Size())),
                    "after": vars(after.get(name, Size())),
                }
                for name in sorted(set(baseline) | set(peak) | set(after))
            },
            "failing": failing,
            "bounded": {name: bound for name, bound in BOUNDED.items() if name in after},
            "processes": {
                name: {"baseline": memory0.get(name, 0), "end": memory_end[name], "per_1000_flows": growth[name]}
                for name in memory_end
            },
            "webhooks_received": [len(hook.received) for hook in hooks],
            "memory_trend": [{"flows": flows_then, **memory} for flows_then, memory in trend],
        }
    finally:
        stack.stop()
        for hook in hooks:
            hook.down()


def print_report(result: dict[str, Any]) -> None:
    print(f"{result['flows']} flows in {result['duration']:g}s, every retention {result['retention']}")
    print(f"{'family':<28} {'baseline: keys entries KiB':>27} | {'peak':>27} | {'after retention':>27}")
    for name, sizes in result["families"].items():
        cells = " | ".join(Size(**sizes[point]).row() for point in ("baseline", "peak", "after"))
        mark = "  STAYS" if name in result["failing"] else ("  bounded: " + BOUNDED[name] if name in BOUNDED else "")
        print(f"{name:<28} {cells}{mark}")
    print("process memory (RSS, MiB): baseline, end of load, growth per 1,000 flows over the load's second half")
    for name, memory in result["processes"].items():
        start, end, growth = (memory[point] / 2**20 for point in ("baseline", "end", "per_1000_flows"))
        print(f"  {name:<30} {start:7.1f} {end:7.1f} {growth:+8.2f}")
    print("every family came back" if not result["failing"] else f"NOT BACK: {', '.join(result['failing'])}")


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(prog="bench.soak", description=__doc__.split("\n\n")[0])
    parse.add_argument("--duration", type=float, default=300.0, help="seconds of load")
    parse.add_argument("--rate", type=float, default=10.0, help="flows started per second")
    parse.add_argument("--retention", default="2m", help="every retention (a duration: 2m, 120s...)")
    parse.add_argument("--schedules", type=int, default=4, help="schedules charging every minute")
    parse.add_argument("--charges", type=int, default=3, help="charges of each schedule, then it completes")
    parse.add_argument("--history", type=int, default=10, help="DURAPAY_SCHEDULES__HISTORY_ENTRIES")
    parse.add_argument("--sample", type=float, default=15.0, help="seconds between samples of the families")
    parse.add_argument("--patience", type=float, default=600.0, help="longest wait past the retentions")
    parse.add_argument("--seed", type=int, default=29)
    parse.add_argument("--json", action="store_true")
    return parse


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    result = run(args, lambda text: print(text, file=sys.stderr, flush=True))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_report(result)
    return 1 if result["failing"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
