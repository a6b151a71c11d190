"""Webhook chaos: flows on the simulator while the merchant's endpoint misbehaves and a worker is killed.

What happens: ``flows`` moto payments (a fifth of them declined) run on a real Celery worker (a
``durapay worker`` process) and a dispatcher in this process; one endpoint is subscribed to every
event, served by a real receiver on 127.0.0.1 that checks each signature with the ``standardwebhooks``
package and applies each event id once. The receiver is down (connections refused) from the start
for ``down`` seconds, then answers 500 or 429 (with Retry-After) at random to ``fail_rate`` of the
requests; the worker is SIGKILLed once while it delivers (a fifth of the events applied), and another
one started.

What must hold, and is checked: every event of the feed is applied (none lost), nothing else is
(none made up: every id applied is in the feed, with the same body), no signature fails.
Repeats (at-least-once) are counted, not failures.

Run once at full size (500 flows, endpoint down 2 minutes, about 4 minutes in all)::

    python -m bench.webhooks_chaos --flows 500 --down 120

The suite runs a short version (tests/workflows/integration/test_webhooks_chaos.py). The retry
delays are shortened (``--delays``) so the run ends in minutes: the schedule's shape is tested in
tests/workflows/webhooks/test_delivery.py, here what is tested is that nothing is lost.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from bench._webhook_receiver import WebhookReceiver
from durapay.config import Settings, load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.service.processes import settings_env
from durapay.service.runtime import build_runtime
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import STOPPED, Dispatcher

ROOT = Path(__file__).resolve().parents[1]
APPROVE = "4349940199004549"
DECLINE = "4349940199997007"


def child_env(settings: Settings, redis_url: str) -> dict[str, str]:
    """The environment that makes a ``durapay worker`` child load ``settings`` (``service.processes``' rule)."""
    return settings_env(settings, redis_url=redis_url) | {"PYTHONPATH": str(ROOT)}


def start_worker(env: dict[str, str], name: str, log: Path, *, webhooks: bool = True) -> subprocess.Popen[bytes]:
    """A ``durapay worker`` child: the deliveries' (``--webhooks``, the one killed) or the steps'."""
    command = [sys.executable, "-c", "from durapay.service.cli import main; main()", "worker", "--pool", "threads"]
    command += ["--webhooks"] if webhooks else []
    command += ["--concurrency", "8", "--loglevel", "warning", "--hostname", f"{name}@%h"]
    with log.open("ab") as out:
        return subprocess.Popen(command, env=env, cwd=ROOT, stdout=out, stderr=out)


def run(
    redis_url: str,
    *,
    flows: int = 60,
    down: float = 5.0,
    fail_rate: float = 0.2,
    seed: int = 7,
    delays: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 3.0),
    timeout: float = 600.0,
    log_dir: Path | None = None,
    say: Any = print,
) -> dict[str, Any]:
    """One run; returns its figures (``lost`` and ``made_up`` must be empty)."""
    rng = random.Random(seed)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="durapay-whchaos-"))
    prefix = "wc" + uuid.uuid4().hex[:8]
    started = time.monotonic()
    with SimulatorServer(SimulatorConfig(seed=seed)) as simulator, WebhookReceiver() as receiver:
        settings = load_settings(
            {
                "gateway": {"base_url": simulator.base_url, "timeout": 3.0, "connect_timeout": 1.0},
                "engine": {"key_prefix": prefix, "lease_seconds": 5.0, "dispatch_interval": 0.05, "partitions": 4},
                "retry": {"base_seconds": 0.05, "cap_seconds": 0.5, "max_attempts": 8, "reconcile_attempts": 8},
                "receiver": {"public_url": "http://127.0.0.1:9/notifications"},
                "webhooks": {
                    "allow_private": True,
                    "lease_seconds": 6.0,  # more than twice an attempt's deadline (connect + timeout)
                    "timeout": 2.0,
                    "connect_timeout": 0.5,
                    "retry_delays": list(delays),
                },
            }
        )
        runtime = build_runtime(settings, redis_url=redis_url, rng=random.Random(seed))
        env = child_env(settings, redis_url)
        endpoint = runtime.webhooks.endpoints.add(receiver.url)
        receiver.secrets = [endpoint.secret]

        def answer(body: dict[str, Any]) -> tuple[int, dict[str, str]]:
            with receiver.lock:
                draw = rng.random()
            if draw < fail_rate / 2:
                return 500, {}
            if draw < fail_rate:
                return 429, {"Retry-After": "1"}
            return 200, {}

        receiver.answer = answer
        receiver.down()
        came_up = time.monotonic() + down
        # The deliveries' worker (killed below) and the steps' (deliveries run apart from payment steps).
        workers = [start_worker(env, "chaos-a", log_dir / "worker-a.log")]
        workers.append(start_worker(env, "chaos-steps", log_dir / "worker-steps.log", webhooks=False))
        dispatcher = Dispatcher(runtime.engine, interval=0.05, tickers=[runtime.webhooks.tick], name="chaos-scheduler").start()
        killed = False
        try:
            ids = []
            for number in range(flows):
                pan = DECLINE if number % 5 == 4 else APPROVE
                order = {"orderId": f"{prefix}-{number}", "amount": str(100 + number), "currency": "EUR"}
                ids.append(
                    runtime.engine.start("moto", {"order": order, "card": {"pan": pan, "expiryDate": "1230", "cvv": "123"}}).id
                )
            say(f"{flows} flows started; endpoint down for {down:g}s")
            deadline = time.monotonic() + timeout
            finished = 0
            while time.monotonic() < deadline:
                if not receiver.is_up and time.monotonic() >= came_up:
                    receiver.up()
                    say(f"endpoint up after {down:g}s; {len(receiver.applied)} applied so far")
                # Killed while it delivers: once the endpoint is back and a fifth of the events arrived.
                delivering = receiver.is_up and len(receiver.applied) >= 2 * flows // 5
                if not killed and (delivering or time.monotonic() > came_up + 60):
                    workers[0].send_signal(signal.SIGKILL)
                    workers[0].wait(10)
                    workers.append(start_worker(env, "chaos-b", log_dir / "worker-b.log"))
                    killed = True
                    say(f"worker SIGKILLed with {finished}/{flows} flows finished, {len(receiver.applied)} events applied")
                finished = sum(1 for flow_id in ids if runtime.engine.get(flow_id).state in STOPPED)
                expected = {event.id for event, _ in runtime.engine.events()}
                if (
                    killed
                    and receiver.is_up
                    and finished == flows
                    and expected <= set(receiver.applied)
                    and runtime.webhooks.pending() == 0
                ):
                    break
                time.sleep(0.25)
            feed = {event.id: event.wire() for event, _ in runtime.engine.events()}
            with receiver.lock:
                applied = dict(receiver.applied)
                statuses = Counter(str(r.status) for r in receiver.received)
            lost = sorted(set(feed) - set(applied))
            made_up = sorted(i for i, body in applied.items() if feed.get(i) != body)
            figures = {
                "flows": flows,
                "finished": finished,
                "events": len(feed),
                "applied": len(applied),
                "repeats": receiver.repeats,
                "answers": dict(statuses),
                "refused_signatures": receiver.refused,
                "lost": lost[:20],
                "lost_count": len(lost),
                "made_up": made_up[:20],
                "made_up_count": len(made_up),
                "pending": runtime.webhooks.pending(),
                "seconds": round(time.monotonic() - started, 1),
                "worker_killed": killed,
            }
        finally:
            dispatcher.stop()
            for process in workers:
                if process.poll() is None:
                    process.terminate()
                    try:
                        process.wait(15)
                    except subprocess.TimeoutExpired:
                        process.kill()
            runtime.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flows", type=int, default=500)
    parser.add_argument("--down", type=float, default=120.0, help="seconds the endpoint is down at the start")
    parser.add_argument("--fail-rate", type=float, default=0.2, help="share of answers that are 500 or 429")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--delays", default="0,0.5,1,2,3", help="retry delays in seconds (shortened schedule)")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="durapay-whchaos-"))
    server = EmbeddedValkey(folder / "valkey", appendfsync="everysec")
    server.start()
    try:
        figures = run(
            server.url,
            flows=args.flows,
            down=args.down,
            fail_rate=args.fail_rate,
            seed=args.seed,
            delays=tuple(float(part) for part in args.delays.split(",")),
            timeout=args.timeout,
            log_dir=folder,
            say=lambda text: print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True),
        )
    finally:
        server.stop()
    print(json.dumps(figures, indent=2))
    ok = not figures["lost_count"] and not figures["made_up_count"] and not figures["refused_signatures"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
