"""Benchmark: the console's flow list with 1,000,000 flows in Redis against the same page with 1,000.

One private Valkey, two key prefixes filled in the same run: a small store (``--small``, 1,000 flows)
and a large one (``--large``, 1,000,000). Flows are written by the store's own creation script
(a bulk loader writing exactly what ``create.lua`` writes, checked against the script at the start of
the run, as pipelined plain commands: each flow a realistic MOTO record with its log entry, due entry,
state and kind index entries, and its order lookup), in groups of 500
sharing a creation time (ties, which the cursors must step through), one in ten sleeping until later
(so the unfiltered list merges two states). The merchant event stream is left out (it is
trimmed in production and the list never reads it).

Then the API (``create_app``, served by uvicorn on a free port, as ``durapay api`` runs it) is asked
for the console's list page over HTTP with a signed-in session, ``--requests`` times per case, for
each store: the newest page, the page 20 pages deep (following the cursors), the list filtered by state,
filtered by kind, a search by order id, and the two small JSON endpoints the pages poll for live
updates (a flow's version; the home page's counters). Prints the median time per case for both stores and their
ratio (large / small; target: about 1, i.e. no growth with the number of flows).

    .venv/bin/python -m bench.bench_console                      # 1,000 vs 1,000,000 (a few minutes)
    .venv/bin/python -m bench.bench_console --large 100000        # quicker
"""

from __future__ import annotations

import argparse
import hashlib
import re
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import redis

from durapay.config import load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.service.app import create_app
from durapay.service.runtime import build_runtime
from durapay.service.server import ApiServer
from durapay.workflows.engine import Engine, FlowStore, NewFlow, compact_json

KEY = "bench-console-key-0123456789"
T0 = 1_900_000_000.0
BATCH = 2000


def moto_input(n: int) -> dict[str, Any]:
    return {
        "order": {"orderId": f"bench-{n:08d}", "amount": str(1000 + n % 5000), "currency": "EUR", "description": "Order"},
        "card": {"pan": "4349940199004549", "expiryDate": "1230", "cvv": "123"},
    }


def new_flow(n: int) -> NewFlow:
    data = moto_input(n)
    run_at = T0 + 10**6 if n % 10 == 9 else None
    return NewFlow("f" + uuid.UUID(int=n + 1).hex[8:], "moto", "pay", data, data["order"]["orderId"], "", run_at)


def created_at(n: int) -> float:
    """Flows are created in groups of 500 sharing one time (ties the cursors must step through)."""
    return T0 + (n // 500) * 0.5


def load(engine: Engine, first: int, count: int) -> None:
    """Write flows ``first .. first + count`` exactly as ``create.lua`` does (the same hash fields, log
    entry, due, state and kind entries) and their order lookups, as plain pipelined commands: one HSET
    and one RPUSH per flow, one ZADD per index and batch. :func:`check_loader` proves it faithful."""
    keys = engine.keys
    pipe = engine.redis.pipeline(transaction=False)
    indexes: dict[str, dict[str, float]] = {}
    for n in range(first, first + count):
        new = new_flow(n)
        now = created_at(n)
        state = "sleeping" if new.run_at is not None else "ready"
        due = new.run_at if new.run_at is not None else now
        data = compact_json(new.data)
        fields = {
            "id": new.flow_id,
            "kind": new.kind,
            "state": state,
            "step": new.first_step,
            "version": "1",
            "attempt": "0",
            "created": repr(now),
            "updated": repr(now),
            "due": repr(due),
            "input": data,
            "order_id": new.order_id,
            "input_hash": hashlib.sha256(f"{new.kind}\x1f{data}".encode()).hexdigest()[:32],
        }
        what = "created" if state == "ready" else "created to run later"
        entry = compact_json({"by": "bench", "from": None, "step": new.first_step, "t": now, "to": state, "what": what})
        partition = keys.partition(new.flow_id)
        pipe.hset(keys.flow(new.flow_id), mapping=fields)
        pipe.rpush(keys.log(new.flow_id), entry)
        pipe.hset(keys.order(new.order_id), "flow", new.flow_id)
        indexes.setdefault(keys.due(partition), {})[new.flow_id] = due
        indexes.setdefault(keys.by_state(partition, state), {})[new.flow_id] = now
        indexes.setdefault(keys.by_kind(partition, new.kind), {})[new.flow_id] = now
    for index, members in indexes.items():
        pipe.zadd(index, members)
    pipe.execute()


def check_loader(redis_url: str) -> None:
    """The bulk loader writes what the creation script writes: the same flow made both ways (two key
    prefixes) has the same record, log, index entries and order lookup."""
    made = []
    for _ in range(2):
        settings = load_settings({"engine": {"key_prefix": f"bc{uuid.uuid4().hex[:8]}"}})
        made.append(build_runtime(settings, redis_url=redis_url))
    by_script, by_loader = (runtime.engine for runtime in made)
    new = new_flow(9)
    store = FlowStore(by_script.redis, by_script.keys, 86400 * 30, events=False)
    store.create_many([new], now=created_at(9), by="bench")
    by_script.orders.claim_many([(new.order_id, new.flow_id)], holder_live=lambda flow_id: False)
    load(by_loader, 9, 1)
    for engine in (by_script, by_loader):
        assert engine.get(new.flow_id).summary() == by_script.get(new.flow_id).summary()
        assert engine.history(new.flow_id) == by_script.history(new.flow_id)
        assert engine.flow_for_order(new.order_id) == new.flow_id
        partition = engine.keys.partition(new.flow_id)
        for index in (
            engine.keys.due(partition),
            engine.keys.by_state(partition, "sleeping"),
            engine.keys.by_kind(partition, "moto"),
        ):
            assert engine.redis.zscore(index, new.flow_id) is not None, index
    fields = [set(engine.redis.hkeys(engine.keys.flow(new.flow_id))) for engine in (by_script, by_loader)]
    assert fields[0] == fields[1], fields
    for runtime in made:
        runtime.close()


def fill(engine: Engine, count: int) -> float:
    """Write ``count`` flows with the bulk loader; returns the seconds it took."""
    started = time.perf_counter()
    for first in range(0, count, BATCH):
        load(engine, first, min(BATCH, count - first))
    return time.perf_counter() - started


def sign_in(client: httpx.Client) -> None:
    login = client.get("/console/login")
    found = re.search(r'name="csrf" value="([^"]+)"', login.text)
    assert found
    answer = client.post("/console/login", data={"key": KEY, "csrf": found.group(1)})
    assert answer.status_code == 303, answer.text


def timed(pairs: list[tuple[httpx.Client, str]], requests: int) -> list[float]:
    """Median seconds of ``requests`` GETs of each (client, url), the stores asked in turn (so that the
    machine's noise falls on both alike), after one warm-up each."""
    for client, url in pairs:
        assert client.get(url).status_code == 200, url
    times: list[list[float]] = [[] for _ in pairs]
    for _ in range(requests):
        for index, (client, url) in enumerate(pairs):
            started = time.perf_counter()
            answer = client.get(url)
            times[index].append(time.perf_counter() - started)
            assert answer.status_code == 200, answer.text[:300]
    return [statistics.median(each) for each in times]


def deep_url(client: httpx.Client, pages: int) -> str:
    url = "/console/flows"
    for _ in range(pages):
        found = re.search(r'href="(/console/flows\?[^"]*after=[^"]+)" id="next-page"', client.get(url).text)
        assert found, "no next page"
        url = found.group(1).replace("&amp;", "&")
    return url


def cases(client: httpx.Client, count: int) -> dict[str, str]:
    return {
        "newest page": "/console/flows",
        "15 pages deep": deep_url(client, 15),
        "state=ready": "/console/flows?state=ready",
        "kind=moto": "/console/flows?kind=moto",
        "search order id": f"/console/flows?q=bench-{count // 2:08d}",
        "live poll, flow": f"/console/live/flows/{new_flow(count // 2).flow_id}",
        "live poll, home": "/console/live/home",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args()
    sizes = (args.small, args.large)
    with tempfile.TemporaryDirectory(prefix="durapay-bench-console-") as folder, ExitStack() as stack:
        server = EmbeddedValkey(Path(folder))
        server.start()
        stack.callback(server.stop)
        redis.Redis.from_url(server.url).config_set("appendonly", "no")  # reads are measured; no 1 GB AOF
        check_loader(server.url)
        clients = []
        for count in sizes:
            settings = load_settings({"api": {"key": KEY}, "engine": {"key_prefix": f"bc{uuid.uuid4().hex[:8]}"}})
            runtime = build_runtime(settings, redis_url=server.url)
            stack.callback(runtime.close)
            seconds = fill(runtime.engine, count)
            print(f"{count:>9,} flows written in {seconds:.1f}s ({count / seconds:,.0f}/s)", flush=True)
            api = stack.enter_context(ApiServer(create_app(runtime)))
            client = stack.enter_context(httpx.Client(base_url=api.url, timeout=60))
            sign_in(client)
            clients.append(client)
        small, large = (cases(client, count) for client, count in zip(clients, sizes, strict=True))
        print(f"\nconsole list page over HTTP, median of {args.requests} requests per case, the two stores in turn")
        print(f"{'case':<18} {args.small:>12,} flows {args.large:>12,} flows   ratio")
        worst = 0.0
        for name in small:
            fast, slow = timed([(clients[0], small[name]), (clients[1], large[name])], args.requests)
            worst = max(worst, slow / fast)
            print(f"{name:<18} {fast * 1000:>15.1f} ms {slow * 1000:>15.1f} ms   {slow / fast:.2f}", flush=True)
        print(f"\nworst ratio (large / small): {worst:.2f}")


if __name__ == "__main__":
    main()
