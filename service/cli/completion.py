"""Shell completion of the values a command takes: flow states, flow kinds and flow ids.

A Tab runs ``durapay`` once; what it imports is what it costs (1.3 s per Tab when every command
loaded the engine, the API and the demo). The root command imports only the command being completed
(``service.cli.COMMAND_MODULES``), command modules import the engine where a command runs, and the
completions here import no more than they need:

* states: the states' enum (``workflows.engine.states``, nothing else);
* kinds: the flow registry is the one list of kinds (durapay's and those of the modules
  ``DURAPAY_FLOWS__MODULES`` names in the environment), but loading it loads Celery and the gateway's
  models, so the names are kept in the user's cache folder with a stamp of the registry's sources
  and the merchant's modules (the setting, their files' names, sizes and modification times) and read
  again only when the stamp changes;
* flow ids: the newest :data:`IDS_SHOWN` flows of the store the settings name (``DURAPAY_REDIS_URL``,
  or the data folder's running embedded Valkey), read with one bounded pipeline over the state
  indexes; nothing when no store answers within :data:`STORE_TIMEOUT` seconds.

A completion never prints an error: a shell would show it as a candidate.
"""

from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from durapay.workflows.engine import FlowState

#: How many flow ids a Tab offers (the newest), and how many each state index of a partition gives.
IDS_SHOWN = 50
#: Seconds a Tab waits for the store, connection and answer alike.
STORE_TIMEOUT = 0.5
#: The registry's sources: their stamp says when the cached kinds are stale.
FLOWS_PACKAGE = Path(__file__).resolve().parents[2] / "workflows" / "flows"


def states(incomplete: str) -> list[str]:
    return [state.value for state in FlowState if state.value.startswith(incomplete)]


def kinds(incomplete: str) -> list[str]:
    return [kind for kind in known_kinds() if kind.startswith(incomplete)]


def flow_ids(incomplete: str) -> list[str]:
    with contextlib.suppress(Exception):  # a Tab shows candidates or nothing, never a traceback
        return [flow_id for flow_id in newest_flow_ids() if flow_id.startswith(incomplete)]
    return []


#: A flow id argument that completes from the store.
FlowId = Annotated[str, typer.Argument(help="A flow id (Tab: the newest flows).", autocompletion=flow_ids)]


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "durapay" / "completion-kinds.json"


#: ``workflows.engine.modules.SETTING``, named here since importing that module loads the engine's steps (a
#: test holds the two equal).
MODULES_SETTING = "DURAPAY_FLOWS__MODULES"


def merchant_modules() -> list[str]:
    """The modules of the merchant's own kinds, as the environment names them (``workflows.engine.modules``)."""
    return [part.strip() for part in os.environ.get(MODULES_SETTING, "").split(",") if part.strip()]


def _module_file(name: str) -> Path | None:
    """Where module ``name`` is, found without running it (its parent packages are imported)."""
    import importlib.util

    with contextlib.suppress(ImportError, ValueError, AttributeError):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            return Path(spec.origin)
    return None


def registry_stamp() -> str:
    """Changes when a source of the flow registry changes (added, removed, edited), or the merchant's
    modules do (the setting, or a module's file)."""
    files = [*FLOWS_PACKAGE.glob("*.py"), *(path for name in merchant_modules() if (path := _module_file(name)))]
    parts = sorted(f"{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}" for path in files if path.exists())
    parts.append("modules=" + ",".join(merchant_modules()))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def known_kinds() -> list[str]:
    """The flow kinds, from the cache while the registry's sources are as they were, else from the
    registry (then cached)."""
    stamp, path = registry_stamp(), cache_file()
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        cached = json.loads(path.read_text())
        if cached["stamp"] == stamp:
            return [str(kind) for kind in cached["kinds"]]
    from durapay.config.settings import SettingsError
    from durapay.workflows.engine import modules
    from durapay.workflows.flows import REGISTRY

    try:
        names = sorted(modules.registry(merchant_modules()))
    except SettingsError:  # a module that does not load: durapay's own kinds (the command itself says why)
        names = sorted(REGISTRY)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"stamp": stamp, "kinds": names}))
    return names


def newest_flow_ids() -> list[str]:
    import redis

    from durapay.config.embedded import running_embedded
    from durapay.config.settings import load_settings
    from durapay.workflows.engine import Keys

    settings = load_settings()
    url = settings.redis_url or running_embedded((Path(settings.data_dir) / "valkey").resolve())
    if not url:
        return []
    keys = Keys(prefix=settings.engine.key_prefix, partitions=settings.engine.partitions)
    client = redis.Redis.from_url(url, socket_timeout=STORE_TIMEOUT, socket_connect_timeout=STORE_TIMEOUT)
    try:
        pipe = client.pipeline(transaction=False)
        for partition in range(keys.partitions):
            for state in FlowState:
                pipe.zrevrange(keys.by_state(partition, state.value), 0, IDS_SHOWN - 1, withscores=True)
        answers: list[list[tuple[Any, float]]] = pipe.execute()
    finally:
        client.close()
    newest = heapq.nlargest(IDS_SHOWN, (entry for answer in answers for entry in answer), key=lambda entry: entry[1])
    return [member.decode() if isinstance(member, bytes) else str(member) for member, _ in newest]
