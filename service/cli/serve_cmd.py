"""``durapay worker``, ``durapay scheduler``, ``durapay api``: the three long-running process types.

Run any number of each, on any machines, against the same Redis (docs/deployment.md, Scaling out):

* ``worker`` - a Celery worker for the step tasks (prefork by default: the fastest pool measured
  here, and a crashed step takes one child, not the worker). ``worker --webhooks`` is the webhook
  deliveries' worker instead: their own queue and pool (threads by default: an attempt mostly waits on
  its endpoint), so that no endpoint, however slow or many, holds a thread a payment step needs.
* ``scheduler`` - the dispatcher: sends what the ``due`` set says is due and fires schedules.
* ``api`` - the receiver and control API on uvicorn, one worker per process.

Each stops cleanly on SIGTERM or Ctrl-C. ``durapay alive worker|scheduler`` is their health check
(exit 0 while the heartbeat is present), for containers.

Before it writes anything each checks the server's persistence (``service.runtime.admit_durability``):
on a server whose ``WAITAOF`` answers before its fsync it refuses to start (exit 2, one line naming the
server and the ways out) unless ``DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF`` is true. While Redis cannot be
reached it waits for it, saying so in one line, and one more when it is back.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import warnings
from enum import StrEnum
from types import FrameType
from typing import Annotated, Any

import typer
from celery import Celery, signals
from celery.exceptions import CPendingDeprecationWarning

from durapay.config.celery import WEBHOOK_QUEUE
from durapay.service.cli._common import ExitCode, Output, runtime, safe_url
from durapay.service.runtime import Runtime, admit_durability, bulk_ticker, freeze_startup_heap
from durapay.workflows.engine import RedisWatch

#: The demo's shared clock (``service.demo.clock``): hidden, not for production use.
ClockKey = Annotated[str | None, typer.Option("--clock-key", hidden=True)]
JsonFlag = Annotated[bool, typer.Option("--json", help="Errors (and the start line) as JSON on stderr.")]


def _started(out: Output, role: str, text: str, **fields: object) -> None:
    """The one line a process prints when it starts: plain, or a JSON object with ``--json``."""
    line = json.dumps({"process": role, "event": "started", **fields}) if out.json else f"durapay {role}: {text}"
    print(line, file=sys.stderr, flush=True)


def _admitted(out: Output, rt: Runtime, role: str, *, every: float = 1.0, stop: threading.Event | None = None) -> bool:
    """Check the server's persistence before the process writes anything (``admit_durability``): exit 2
    with one line on a server whose ``WAITAOF`` answers before its fsync, unless accepted. While Redis
    cannot be reached, try every ``every`` seconds (one line when lost, one when back, as the loops say
    it). False when stopped meanwhile: ``stop`` set, or without one, SIGTERM or Ctrl-C."""
    own = stop is None
    stopping = threading.Event() if stop is None else stop
    previous: dict[signal.Signals, Any] = {}
    if own:

        def _stop(signum: int, frame: FrameType | None) -> None:
            stopping.set()

        for number in (signal.SIGTERM, signal.SIGINT):
            previous[number] = signal.signal(number, _stop)
    watch = RedisWatch(role, logging.getLogger("durapay.start"), every)
    try:
        with out.errors():
            while not stopping.is_set():
                try:
                    admit_durability(rt, where=safe_url(rt.redis_url))
                except Exception as exc:
                    if not watch.failed(exc):
                        raise
                    stopping.wait(every)
                    continue
                watch.ok()
                return True
        return False
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Role(StrEnum):
    worker = "worker"
    webhooks = "webhooks"
    scheduler = "scheduler"


#: Threads of a deliveries worker (``durapay worker --webhooks``) unless ``--concurrency`` says otherwise:
#: each attempt holds one for at most its deadline (``DURAPAY_WEBHOOKS__CONNECT_TIMEOUT + __TIMEOUT``).
WEBHOOK_THREADS = 8


class Pool(StrEnum):
    prefork = "prefork"
    threads = "threads"
    solo = "solo"


def worker(
    pool: Annotated[
        Pool | None, typer.Option(help="Celery pool: prefork (the default for steps), threads (for --webhooks) or solo.")
    ] = None,
    concurrency: Annotated[
        int | None, typer.Option(min=1, help=f"Processes or threads (default: one per CPU; --webhooks: {WEBHOOK_THREADS}).")
    ] = None,
    webhooks: Annotated[
        bool, typer.Option("--webhooks", help="Deliver webhooks (their own queue) instead of running flow steps.")
    ] = False,
    loglevel: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    hostname: Annotated[str | None, typer.Option(help="Worker name (default: celery@<host>).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No start-up banner (durapay dev's short log).")] = False,
    clock_key: ClockKey = None,
    as_json: JsonFlag = False,
) -> None:
    """Run a Celery worker for the flows' step tasks, or with --webhooks for webhook deliveries (exits
    non-zero if it stops on a fatal error)."""
    out = Output(as_json)
    role = Role.webhooks if webhooks else Role.worker
    chosen = pool or (Pool.threads if webhooks else Pool.prefork)
    with runtime(out, clock_key, may_start_store=True) as rt:
        if not _admitted(out, rt, role.value):
            return
        argv = [
            "worker",
            f"--pool={chosen.value}",
            f"--loglevel={loglevel}",
            f"--queues={WEBHOOK_QUEUE if webhooks else ','.join(rt.engine.fairness.step_queues())}",
            "--without-mingle",
            "--without-gossip",
        ]
        if concurrency or webhooks:
            argv.append(f"--concurrency={concurrency or WEBHOOK_THREADS}")
        if hostname or webhooks:
            argv.append(f"--hostname={hostname or 'webhooks@%h'}")
        if quiet:
            argv.insert(0, "--quiet")  # celery's own option, before the command
        where = safe_url(rt.redis_url)
        what = "webhook deliveries" if webhooks else "flow steps"
        _started(out, role.value, f"{chosen.value} pool for {what} on {where}", pool=chosen.value, redis=where)
        code = run_worker(rt.celery, argv)
    if code:
        out.fail("worker_stopped", f"the worker stopped with exit status {code} (see its log)", code=code)
    raise typer.Exit(code)


def run_worker(app: Celery, argv: list[str]) -> int:
    """Run the Celery worker until it stops; its exit status (non-zero after a fatal error).

    Not ``app.worker_main`` (nor ``app.start``): they drop the status that ``celery worker`` ends
    with, so a worker that stopped on an "Unrecoverable error" exited 0 and a supervisor restarting
    on failure left it down. This runs the same ``celery`` command, bound to ``app`` the way
    ``app.start`` binds it, and keeps the status.
    """
    from celery.bin.celery import celery as celery_command

    signals.celeryd_after_setup.connect(_quiet_reconnect_warning, weak=False)
    celery_command.params[0].default = app  # the --app option, as app.start sets it
    try:
        code = celery_command.main(args=argv, standalone_mode=False)
    finally:
        celery_command.params[0].default = None
    return code if isinstance(code, int) else 0


def _quiet_reconnect_warning(**_: object) -> None:
    """Celery warns on every reconnect that it does not cancel the steps in flight: that is the choice
    (config/celery.py), and the warning would repeat through a Redis outage. Added after Celery's own
    log set-up, which turns its warnings back on."""
    warnings.filterwarnings("ignore", category=CPendingDeprecationWarning, module="celery.worker.consumer")


def scheduler(
    interval: Annotated[
        float | None, typer.Option(min=0.01, help="Seconds between ticks (DURAPAY_ENGINE__DISPATCH_INTERVAL).")
    ] = None,
    clock_key: ClockKey = None,
    as_json: JsonFlag = False,
) -> None:
    """Run the dispatcher: send due steps (timers, retries, waits, lost messages), fire schedules, send webhooks,
    reconcile daily (DURAPAY_RECONCILE__DAILY)."""
    from durapay.workflows.engine import Dispatcher
    from durapay.workflows.reconciliation.daily import DailyReconciliation
    from durapay.workflows.schedules import Schedules

    # One timestamped line per event (a Redis outage is two: lost, back), on stderr.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    out = Output(as_json)
    with runtime(out, clock_key, may_start_store=True) as rt:
        schedules = Schedules(rt.engine)
        tickers = [schedules.tick, rt.webhooks.tick, DailyReconciliation(rt.engine).tick, bulk_ticker(rt)]
        dispatcher = Dispatcher(rt.engine, interval=interval, tickers=tickers, name="scheduler")
        stopping = threading.Event()

        def _stop(signum: int, frame: FrameType | None) -> None:
            stopping.set()
            dispatcher.stop()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        if not _admitted(out, rt, "scheduler", every=dispatcher.interval, stop=stopping):
            print("durapay scheduler: stopped", file=sys.stderr, flush=True)
            return
        rt.webhooks.endpoints.sync_configured()  # DURAPAY_WEBHOOKS__ENDPOINTS
        freeze_startup_heap()
        where = safe_url(rt.redis_url)
        _started(out, "scheduler", f"every {dispatcher.interval:g}s on {where}", interval=dispatcher.interval, redis=where)
        dispatcher.run()
        print("durapay scheduler: stopped", file=sys.stderr, flush=True)


def api(
    host: Annotated[str | None, typer.Option(help="Address to bind (DURAPAY_API__HOST).")] = None,
    port: Annotated[int | None, typer.Option(min=0, max=65535, help="Port (DURAPAY_API__PORT).")] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow an empty DURAPAY_API__KEY: no key needed (local only).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Serve the notification receiver and the control API (uvicorn, one worker)."""
    from durapay.service.app import create_app
    from durapay.service.auth import MissingApiKey
    from durapay.service.server import serve_forever

    out = Output(as_json)
    with runtime(out, may_start_store=True) as rt:
        try:
            app = create_app(rt, insecure=insecure)
        except MissingApiKey as exc:
            out.fail("configuration", str(exc), field="DURAPAY_API__KEY", human=str(exc))
        if not _admitted(out, rt, "api"):
            return
        bind_host = host or rt.settings.api.host
        bind_port = rt.settings.api.port if port is None else port
        if insecure and not rt.settings.api.key.get_secret_value():
            print("durapay api: WARNING: no API key; anyone who can reach this port controls the flows", file=sys.stderr)
        url, where = f"http://{bind_host}:{bind_port}", safe_url(rt.redis_url)
        _started(out, "api", f"{url} (receiver {rt.settings.receiver.path}, docs /docs) on {where}", url=url, redis=where)
        serve_forever(app, bind_host, bind_port)


def alive(
    role: Annotated[
        Role,
        typer.Argument(help="worker (this host's worker), webhooks (this host's deliveries worker) or scheduler (any)."),
    ],
    name: Annotated[
        str | None, typer.Option(help="The worker's name (default: celery@<this host>; webhooks: webhooks@<this host>).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (errors too, on stderr).")] = False,
) -> None:
    """Exit 0 if the heartbeat is present, 1 if not: a container health check."""
    import socket

    out = Output(as_json)
    with runtime(out) as rt, out.errors():
        key = rt.engine.keys.heartbeat(role.value)
        if role is Role.worker:
            key = rt.engine.keys.heartbeat(f"worker:{name or 'celery@' + socket.gethostname()}")
        elif role is Role.webhooks:
            key = rt.engine.keys.heartbeat(f"webhooks:{name or 'webhooks@' + socket.gethostname()}")
        present = bool(rt.redis.exists(key))
    if as_json:
        typer.echo(json.dumps({"role": role.value, "alive": present}))
    else:
        typer.echo(f"{role.value}: {'alive' if present else 'no heartbeat'}")
    raise typer.Exit(ExitCode.OK if present else ExitCode.FAILED)


def register(app: typer.Typer) -> None:
    app.command("alive")(alive)
    app.command("worker")(worker)
    app.command("scheduler")(scheduler)
    app.command("api")(api)
