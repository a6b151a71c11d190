"""No card data in Redis's files (issue 37, finding 9): card fields are written only sealed.

The PAN of a finished MOTO was erased from its record but stayed in the append-only file until a
rewrite (and in any RDB snapshot, replica or backup made while the flow ran). Here every card-carrying
kind (MOTO, card verification, three steps with and without a challenge, init/pay, wallet) runs for
every published test card on a Valkey of this test's own; then its files, every AOF part (base and
incremental, which keeps every write since the server started) and an RDB dump (saved
uncompressed, so that nothing hides in LZF), are searched for each
card number, each CVV and expiry date in their JSON context, and the wallet's token: none is there.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.contrib.testing.worker import start_worker

from durapay.config.embedded import EmbeddedValkey
from durapay.service.runtime import Runtime, build_runtime
from durapay.simulator import SimulatorServer
from durapay.simulator._cards import PUBLISHED_CARDS
from durapay.simulator._config import AUTO_COMPLETE_PAN
from durapay.workflows.engine.dispatcher import Dispatcher
from durapay.workflows.engine.states import FlowState
from tests.workflows.integration.conftest import stack_settings
from tests.workflows.integration.test_flows import order

pytestmark = pytest.mark.integration

CARDS = sorted({*PUBLISHED_CARDS, AUTO_COMPLETE_PAN})
KINDS = ("moto", "card_verification", "three_steps", "svs", "wallet")
ENDED = frozenset({FlowState.SUCCEEDED, FlowState.FAILED, FlowState.CANCELLED, FlowState.NEEDS_ATTENTION})


@pytest.fixture
def own_valkey(tmp_path: Path) -> Iterator[EmbeddedValkey]:
    server = EmbeddedValkey(tmp_path / "valkey", appendfsync="always")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def running(own_valkey: EmbeddedValkey, key_prefix: str, simulator: SimulatorServer) -> Iterator[Runtime]:
    simulator.admin.clear_faults()
    runtime = build_runtime(stack_settings(key_prefix, simulator.base_url), redis_url=own_valkey.url, rng=random.Random(9))
    with ExitStack() as stack:
        stack.enter_context(start_worker(runtime.celery, pool="threads", concurrency=4, perform_ping_check=False))
        dispatcher = Dispatcher(runtime.engine, interval=0.05).start()
        stack.callback(dispatcher.stop)
        yield runtime
    runtime.close()


def _input(kind: str, pan: str, cvv: str, expiry: str, token: str) -> dict[str, Any]:
    if kind == "wallet":
        return {"order": order(), "walletPaymentData": {"pan": pan, "token": token}}
    return {"order": order(0 if kind == "card_verification" else 1500), "card": {"pan": pan, "expiryDate": expiry, "cvv": cvv}}


def _files(server: EmbeddedValkey) -> dict[str, bytes]:
    """Every file of the server's data folder that holds data: the AOF's parts and the RDB dump."""
    return {str(path.relative_to(server.data_dir)): path.read_bytes() for path in server.data_dir.rglob("*") if path.is_file()}


def test_no_card_data_in_the_aof_or_an_rdb_dump_after_every_card_carrying_kind(
    running: Runtime, own_valkey: EmbeddedValkey, simulator: SimulatorServer
) -> None:
    engine = running.engine
    rng = random.Random(37)
    secrets: list[bytes] = []
    started = []
    for kind in KINDS:
        for pan in CARDS:
            cvv, expiry, token = (
                f"{rng.randrange(1000, 10000)}",
                f"{rng.randrange(1, 13):02d}{rng.randrange(30, 40)}",
                f"wtok{rng.getrandbits(48):x}",
            )
            secrets += [pan.encode(), f'"cvv":"{cvv}"'.encode(), f'"expiryDate":"{expiry}"'.encode(), token.encode()]
            started.append(engine.start(kind, _input(kind, pan, cvv, expiry, token)).id)
    for flow_id in started:
        record = engine.wait(flow_id, 30, states=ENDED | {FlowState.WAITING})
        if record.state is FlowState.WAITING and record.kind == "three_steps":
            init = record.outputs["init"]
            pares = simulator.admin.acs_challenge(init["operation"]["operationId"], init["threeDSAuthRequest"])
            engine.signal(flow_id, "3ds_result", {"PaRes": pares})
        elif record.state is FlowState.WAITING:
            engine.cancel(flow_id, reason="test: nothing to wait for")
    records = [engine.wait(flow_id, 30, states=ENDED) for flow_id in started]
    assert sum(record.state is FlowState.SUCCEEDED for record in records) >= len(KINDS) * 2, [r.state for r in records]

    # The AOF as it is (its incremental part holds every write since the server started: the history),
    # then an RDB dump of what is there now (uncompressed: nothing hides in LZF).
    files = _files(own_valkey)
    client = redis.Redis.from_url(own_valkey.url)
    try:
        client.config_set("rdbcompression", "no")
        client.save()
    finally:
        client.close()
    files |= {name: data for name, data in _files(own_valkey).items() if name.endswith(".rdb")}
    assert any(name.endswith(".rdb") for name in files) and any(".incr.aof" in name for name in files), sorted(files)
    everything = b"".join(files.values())
    found = [(secret.decode(), name) for secret in secrets for name, data in files.items() if secret in data]
    assert found == [], f"card data in Redis's files: {found[:5]}"
    assert re.search(rb"dpc1\.test\.", everything), "the cards were written sealed (the test saw them go by)"
