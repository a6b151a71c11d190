"""Wiring: from the settings to a running set of parts (Redis, Celery app, tasks, engine).

Every process (worker, scheduler, API, demo, tests) builds its parts here, so they agree on keys,
queues and flow kinds. With no ``DURAPAY_REDIS_URL`` an embedded Valkey is started under
``DURAPAY_DATA_DIR`` (AOF on); child processes are then given its URL explicitly.

One data folder, one server: the process that starts the embedded Valkey writes its URL to
``<data_dir>/valkey/server.json``; another ``durapay`` process with no Redis configured (say
``durapay flows ls`` while ``durapay demo --keep`` runs) finds it there and uses it instead of starting
a second server on the same AOF files. A file lock makes two processes starting at once agree.

Workers built here time every step for ``/metrics`` and keep a heartbeat for ``/readyz``.

A process that writes flows (worker, scheduler, API, the CLI's flow commands) calls
:func:`admit_durability` at start, before it writes anything: it refuses a server whose ``WAITAOF``
answers before its fsync unless the settings accept that, and resolves the engine's durability then
rather than at the first payment.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import os
import queue
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from celery import Celery, signals
from kombu.connection import ConnectionPool
from kombu.utils.functional import lazy
from pydantic import SecretStr

from durapay.config.celery import make_celery
from durapay.config.connect import open_redis
from durapay.config.embedded import SERVER_FILE, EmbeddedValkey, running_embedded
from durapay.config.settings import CardSettings, Settings, SettingsError, load_settings
from durapay.config.tracing import OFF, Tracing, from_environ
from durapay.service.heartbeat import install_worker_heartbeat
from durapay.service.metrics import StepMetrics
from durapay.tasks.celery_tasks import CelerySender, register_bulk_task, register_tasks, register_webhook_task
from durapay.workflows.bulk import BulkActions
from durapay.workflows.engine import (
    Clock,
    Durability,
    EarlyWaitaof,
    Engine,
    Fairness,
    FlowDefinition,
    ServerClock,
    early_waitaof_risk,
    install_log_masking,
    kept_keys,
    mask_text,
    modules,
    terminals,
)
from durapay.workflows.schedules.store import live_on
from durapay.workflows.webhooks import Webhooks


@dataclass
class Runtime:
    settings: Settings
    redis_url: str
    redis: Any
    celery: Celery
    engine: Engine
    webhooks: Webhooks
    embedded: EmbeddedValkey | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    #: Bulk retries and cancels (``workflows.bulk``), their runner a Celery task.
    bulk: BulkActions | None = None
    #: Traces (``config.tracing``): the off face unless OTEL_* configured them.
    tracing: Tracing = OFF

    def close(self) -> None:
        """Release every connection the parts opened (the engine's Redis, Celery's broker connections
        and producers) and stop an embedded Valkey this runtime started; export the spans left."""
        close_celery(self.celery)
        self.tracing.close()
        self.redis.close()
        if self.embedded is not None:
            stop_embedded(self.embedded)
            self.embedded = None


def close_celery(app: Celery) -> None:
    """Close the broker connections ``app`` holds idle: its producers' and its connection pool's.
    ``Celery.close`` only forgets the pool, leaving its sockets open until the process ends (a process
    that connects and closes over and over, durapay.connect in a loop, kept two connections a round).

    Emptied, not closed: kombu keeps one pool per broker address for the whole process
    (``kombu.pools``), shared by every app on that broker; a pool closed outright fails every other
    runtime of the process on the same broker ("Acquire on closed pool"), an emptied one builds its
    connections again when next used. A connection another thread is using is left to it."""
    amqp = app.__dict__.get("amqp")  # a cached property: absent when nothing was ever sent
    for pool in (getattr(amqp, "_producer_pool", None), app._pool):
        if pool is not None:
            _empty(pool)
    app.close()


def _empty(pool: Any) -> None:
    """Close each idle item of a kombu pool and put an unbuilt one in its place, as the pool's own
    ``setup`` fills it (an acquire waits on the queue: taken away, the next acquire would wait for ever)."""
    emptied = 0
    while True:
        try:
            idle = pool._resource.get_nowait()
        except queue.Empty:
            break
        emptied += 1
        with contextlib.suppress(AttributeError):  # an item never built (kombu's own guard)
            pool.collect_resource(idle)
    for _ in range(emptied):
        pool._resource.put_nowait(lazy(pool.new) if isinstance(pool, ConnectionPool) else pool.new())  # type: ignore[no-untyped-call]


def freeze_startup_heap() -> None:
    """Take what start-up built out of the cyclic garbage collector's reach, once the process's parts
    are built and before its loop begins.

    A long-running loop (the scheduler ticking batches of 500 schedules) keeps enough objects alive per
    batch to trigger full collections, and each walks every object of the process: about 80,000 made at
    start-up (modules, pydantic schemas, the catalogue) that live as long as the process. Measured, that
    was 20-25 us of the scheduler's CPU per occurrence fired. ``gc.freeze`` moves them to a permanent
    generation that collections skip; objects made later are collected as before.
    """
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def resolve_redis(settings: Settings) -> tuple[str, EmbeddedValkey | None]:
    """The configured Redis URL; else the embedded Valkey already serving the data folder; else a newly
    started one (returned, so that its owner stops it)."""
    if settings.redis_url:
        return settings.redis_url, None
    return start_embedded(embedded_folder(settings))


def embedded_folder(settings: Settings) -> Path:
    """Where the data folder's embedded Valkey keeps its AOF and ``server.json``."""
    return (Path(settings.data_dir) / "valkey").resolve()


def start_embedded(folder: Path, *, own_session: bool = False) -> tuple[str, EmbeddedValkey | None]:
    """The embedded Valkey serving ``folder``: the one already running (None: another process owns it),
    or one started now and recorded in ``server.json`` (returned: its owner stops it)."""
    with _locked(folder):
        url = running_embedded(folder)
        if url is not None:
            return url, None
        server = EmbeddedValkey(folder, own_session=own_session)
        server.start()
        _record(server)
        return server.url, server


def restart_embedded(server: EmbeddedValkey, *, timeout: float = 60.0) -> None:
    """Start ``server`` again after it died: the same port and data (its AOF), recorded again."""
    with _locked(server.data_dir):
        server.start(timeout=timeout)
        _record(server)


def stop_embedded(server: EmbeddedValkey) -> None:
    """Stop ``server`` (its AOF flushed) and forget it in ``server.json``."""
    with _locked(server.data_dir):
        (server.data_dir / SERVER_FILE).unlink(missing_ok=True)
        server.stop()


def _record(server: EmbeddedValkey) -> None:
    pid = server.process.pid if server.process else None
    (server.data_dir / SERVER_FILE).write_text(json.dumps({"url": server.url, "pid": pid}))


def build_runtime(
    settings: Settings,
    *,
    redis_url: str | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    flows: dict[str, FlowDefinition] | None = None,
    tracing: Tracing | None = None,
) -> Runtime:
    """Build the parts. ``redis_url`` overrides the settings (tests, and children of the demo). Card
    numbers in the process's log lines are masked from here on (``workflows.engine.sensitive``). ``tracing``:
    by default as the process's OTEL_* variables say (``config.tracing.from_environ``: off unless set).

    A build that fails releases what it had opened, and stops the embedded Valkey it started (else it
    ran on, recorded in ``server.json``, after ``durapay.connect`` raised)."""
    install_log_masking()
    settings = _dev_card_keys(settings)
    if tracing is None:
        tracing = from_environ(os.environ, mask=mask_text)
    with contextlib.ExitStack() as opened:
        embedded = None
        if redis_url is None:
            redis_url, embedded = resolve_redis(settings)
            if embedded is not None:
                opened.callback(stop_embedded, embedded)
        runtime = _build(settings, redis_url, embedded, opened, clock=clock, rng=rng, flows=flows, tracing=tracing)
        opened.pop_all()  # built: the runtime's close releases them
        return runtime


def _dev_card_keys(settings: Settings) -> Settings:
    """``settings`` with the card key ``durapay dev`` keeps (``<data dir>/dev/card-keys``) when none is
    configured and the store is the data folder's own embedded Valkey (no ``DURAPAY_REDIS_URL``): a script
    or a CLI command beside ``durapay dev`` opens and seals the cards its workers do. Never otherwise."""
    if settings.card.keys or settings.redis_url:
        return settings
    kept = kept_keys(Path(settings.data_dir) / "dev", make=False)
    if not kept:
        return settings
    return settings.model_copy(update={"card": CardSettings(keys=[SecretStr(entry) for entry in kept])})


def _build(
    settings: Settings,
    redis_url: str,
    embedded: EmbeddedValkey | None,
    opened: contextlib.ExitStack,
    *,
    clock: Clock | None,
    rng: random.Random | None,
    flows: dict[str, FlowDefinition] | None,
    tracing: Tracing,
) -> Runtime:
    """The parts on ``redis_url``; each connection opened is registered in ``opened`` until built."""
    client = open_redis(
        redis_url, cluster=settings.redis_cluster, socket_timeout=10, socket_connect_timeout=5, health_check_interval=30
    )
    opened.callback(client.close)
    fairness = Fairness(settings.fairness)
    app = make_celery(settings, settings.broker_url or redis_url, step_queues=fairness.queues() if fairness.on else ())
    opened.callback(close_celery, app)
    registry = modules.registry(settings.flows.names)  # durapay's kinds and DURAPAY_FLOWS__MODULES's
    registry.update(flows or {})
    sender = CelerySender(app)
    engine = Engine(settings, client, registry, sender=sender, clock=clock or ServerClock(client), rng=rng, tracing=tracing)
    engine.protocol.observer = StepMetrics(engine).record
    register_tasks(app, engine.run_step, follow=settings.engine.follow_steps)
    webhooks = Webhooks(
        client, engine.keys, settings.webhooks, send=sender.send_webhook, now=engine.clock.now, rng=rng, tracing=tracing
    )
    register_webhook_task(app, webhooks.deliver_many)
    bulk = BulkActions(engine, settings.bulk, send=sender.send_bulk)
    register_bulk_task(app, bulk.run, sender.send_bulk)
    install_worker_heartbeat(app, redis_url, engine.keys, cluster=settings.redis_cluster)
    if tracing.on:
        # A prefork pool's child (forked after the exporter was built) exits without the interpreter's
        # exit hooks: its spans still in a batch would be lost at each warm stop or recycle. (Weakly held:
        # a runtime's tracing gone, its receiver goes.)
        signals.worker_process_shutdown.connect(tracing.flush)
    return Runtime(settings, redis_url, client, app, engine, webhooks, embedded, bulk=bulk, tracing=tracing)


def bulk_ticker(runtime: Runtime) -> Callable[[], int]:
    """The scheduler's ticker that sends the runner of each bulk action whose progress stopped."""

    def tick() -> int:
        return runtime.bulk.revive(now=runtime.engine.clock.now()) if runtime.bulk is not None else 0

    return tick


class NoFlowStore(SettingsError):
    """No Redis is configured and no embedded Valkey serves the data folder: a flow started here would be
    written to a new, empty store that no worker reads (``durapay.connect`` from another folder did that,
    card included, and ``wait`` timed out with no hint why). ``folder``: where the store was looked for."""

    def __init__(self, folder: Path) -> None:
        super().__init__(no_store_text(folder))
        self.folder = folder


def no_store_text(folder: Path) -> str:
    """The one sentence every surface refuses a missing store with: where it looked, how to point at one."""
    return (
        f"no flow store: DURAPAY_REDIS_URL is not set and no embedded Valkey runs under {folder} "
        f"(DURAPAY_DATA_DIR, relative to where the process runs: {Path.cwd()}); run it where `durapay dev` runs, "
        "set DURAPAY_DATA_DIR to dev's data folder (the Data line of its banner), or set DURAPAY_REDIS_URL"
    )


def served_store(settings: Settings) -> str | None:
    """The URL of the flow store the settings name that a process serves now: ``DURAPAY_REDIS_URL``, else
    the embedded Valkey running under ``DURAPAY_DATA_DIR`` (``durapay dev``, ``demo --keep``, a worker);
    None when neither."""
    return settings.redis_url or running_embedded(embedded_folder(settings))


def connect(settings: Settings | None = None, *, redis_url: str | None = None) -> Engine:
    """The engine of ``durapay.connect``: the Python API (start, get, wait, list, history, signal, cancel,
    retry) on the flow store the settings name, ready to write.

    ``settings``: the ``DURAPAY_*`` environment when omitted. ``redis_url`` overrides the settings'.
    With neither a Redis URL, the embedded Valkey serving ``DURAPAY_DATA_DIR`` (``.durapay`` under the
    folder the process runs in, by default) is used if one runs there (``durapay dev`` starts one);
    none running is :class:`NoFlowStore` (a :class:`SettingsError`) naming the folder looked in: this
    call never starts a store of its own, which no worker would serve. The server's persistence is
    checked before anything is written (:func:`admit_durability`). The engine's ``close`` (or a
    ``with`` block) releases the connections. Steps run on workers (``durapay worker``) reading the same
    settings.
    """
    settings = settings if settings is not None else load_settings()
    if redis_url is None:
        redis_url = served_store(settings)
        if redis_url is None:
            raise NoFlowStore(embedded_folder(settings))
    runtime = build_runtime(settings, redis_url=redis_url)
    try:
        admit_durability(runtime)
    except BaseException:
        runtime.close()
        raise
    runtime.engine.closer = runtime.close
    return runtime.engine


def admit_durability(runtime: Runtime, *, where: str | None = None) -> Durability:
    """Check the server's persistence before the process writes anything, and resolve the engine's
    durability now (``FlowStore.durability``, otherwise decided at the first write that needs it).

    Raises :class:`EarlyWaitaof` (naming the server, and ``where``: the URL to print) when the server
    confirms ``WAITAOF`` before the fsync the engine would wait for, unless
    ``DURAPAY_ENGINE__ACCEPT_EARLY_WAITAOF`` is true: then the engine's warning says what may be lost.
    A connection error propagates (the caller waits Redis out, or fails)."""
    engine = runtime.settings.engine
    server = early_waitaof_risk(runtime.redis, engine.sync_aof)
    if server is not None and not engine.accept_early_waitaof:
        raise EarlyWaitaof(server, where=where)
    admit_terminals(runtime.engine)
    return runtime.engine.store.durability


def admit_terminals(engine: Engine) -> None:
    """Refuse to start (:class:`TerminalRemoved`, a SettingsError naming each terminal with its flows in
    flight, counted by kind, and its live schedules, by id) when flows in flight or live schedules use a
    terminal the settings no longer declare: a flow's calls could only be parked here, never made on another
    terminal's key (``workflows.engine.terminals``), and each charge of a schedule would be refused. One SMEMBERS
    while every terminal ever used is declared."""
    missing = terminals.undeclared(engine.redis, engine.keys, engine.terminals.names)
    if not missing:
        return
    flows = terminals.in_flight_on(engine.redis, engine.keys, missing)
    schedules = live_on(engine.redis, engine.keys, missing)
    if flows or schedules:
        raise terminals.TerminalRemoved(flows, schedules)
