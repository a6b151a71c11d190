"""Regenerate the compression dictionary of packed flows (``workflows/engine/compact_v1.zdict``).

A finished flow's packed value (``workflows/engine/compact.py``) is a small JSON document: most of it is the
same keys and structures in every flow of a kind (gateway answers, log entries). zlib compresses such
small documents far better with a preset dictionary holding those common parts. This script runs a
few flows of the usual kinds against the simulator (in-process, on a private Valkey), packs them and
writes the concatenation of their JSON as the dictionary.

A dictionary is forever: packed values name the dictionary version they were made with, and a
version's file must never change once released. To improve it, write a new version (``--version 2``),
point ``compact.DICTIONARY_VERSION`` at it, and keep the old file for reading.

    .venv/bin/python -m bench.compact_dictionary --version 1
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

import redis

from durapay.config import load_settings
from durapay.config.embedded import EmbeddedValkey
from durapay.simulator import SimulatorConfig, SimulatorServer
from durapay.workflows.engine import STOPPED, Engine, pack_json
from durapay.workflows.flows import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
_ids = itertools.count()


def card(pan: str = "4349940199004549") -> dict[str, str]:
    return {"pan": pan, "expiryDate": "1230", "cvv": "123"}


def order(amount: int = 1500) -> dict[str, Any]:
    return {"orderId": f"dict{next(_ids)}", "amount": str(amount), "currency": "EUR", "description": "order"}


def samples() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("three_steps", {"order": order(), "card": card()}),
        ("moto", {"order": order(), "card": card()}),
        ("moto", {"order": order(), "card": card("4349940199997007")}),
        ("svs", {"order": order(), "card": card()}),
        ("card_verification", {"order": order(0), "card": card()}),
        ("wallet", {"order": order(), "walletPaymentData": {"pan": "4349940199004549"}}),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", type=int, required=True)
    args = parser.parse_args()
    target = ROOT / "workflows" / f"engine/compact_v{args.version}.zdict"
    if target.exists():
        raise SystemExit(f"{target.name} exists: a released dictionary never changes; write a new version")
    parts: list[bytes] = []
    with (
        tempfile.TemporaryDirectory() as folder,
        EmbeddedValkey(Path(folder)) as valkey,
        SimulatorServer(SimulatorConfig(seed=1, port=0)) as sim,
    ):
        client = redis.Redis.from_url(valkey.url)
        settings = load_settings({"gateway": {"base_url": sim.base_url}, "engine": {"key_prefix": "dict"}})
        engine = Engine(settings, client, REGISTRY)
        for kind, data in samples():
            record = engine.start(kind, data)
            while (current := engine.get(record.id)).state not in STOPPED:
                engine.run_step(record.id, current.step)
            raw = {key.decode(): value.decode() for key, value in client.hgetall(engine.keys.flow(record.id)).items()}
            log = [entry.decode() for entry in client.lrange(engine.keys.log(record.id), 0, -1)]
            parts.append(pack_json(raw, log))
        engine.gateway().close()
    target.write_bytes(b"".join(parts)[-32768:])
    print(f"wrote {target.relative_to(ROOT)}: {target.stat().st_size} bytes from {len(parts)} flows")
    print(json.dumps({"version": args.version}))


if __name__ == "__main__":
    main()
