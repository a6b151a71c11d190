"""Redis key names. Every key of a flow carries its partition's hash tag.

Why partitions: an atomic update touches the flow's hash, its log, the ``due`` set and the state
indexes together. Under Redis Cluster all keys of one script must sit in one slot, so the due set and
indexes are split into ``partitions`` pieces and a flow's keys all carry the tag of its piece:
``durapay:{p3}:flow:<id>``, ``durapay:{p3}:due``. On a single primary this costs nothing; the
dispatcher simply visits every partition.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "durapay"
    partitions: int = 4

    def partition(self, flow_id: str) -> int:
        return zlib.crc32(flow_id.encode()) % self.partitions

    def tag(self, partition: int) -> str:
        return f"{self.prefix}:{{p{partition}}}"

    def flow(self, flow_id: str) -> str:
        return f"{self.tag(self.partition(flow_id))}:flow:{flow_id}"

    def log(self, flow_id: str) -> str:
        return f"{self.tag(self.partition(flow_id))}:log:{flow_id}"

    def attention(self, flow_id: str) -> str:
        """The flow's reconciliation marks (``workflows.reconciliation.report``): a hash beside its record,
        never part of it (a mark is for a person and changes nothing of the flow)."""
        return f"{self.tag(self.partition(flow_id))}:attention:{flow_id}"

    def due(self, partition: int) -> str:
        return f"{self.tag(partition)}:due"

    def due_of(self, flow_id: str) -> str:
        return self.due(self.partition(flow_id))

    def by_state(self, partition: int, state: str) -> str:
        return f"{self.tag(partition)}:state:{state}"

    def by_kind(self, partition: int, kind: str) -> str:
        return f"{self.tag(partition)}:kind:{kind}"

    def finished(self, partition: int) -> str:
        """Flows that finished and are not yet packed (``workflows.engine.compact``), scored by when."""
        return f"{self.tag(partition)}:finished"

    def operation(self, partition: int, operation_id: str) -> str:
        """String: the flow that recorded gateway operation ``operation_id``, in that flow's partition
        (written by ``transition.lua`` with the step's output; the console's search reads every
        partition's)."""
        return f"{self.tag(partition)}:op:{operation_id}"

    def events(self, partition: int) -> str:
        """Stream of the partition's merchant events (``workflows.engine.events``), written with the changes."""
        return f"{self.tag(partition)}:events"

    # -- notification lookups: keyed by the gateway's orderId, in the order id's own partition ------

    def packing(self, flow_id: str) -> str:
        """Scratch hash in the flow's slot where a finished record is packed before it replaces it."""
        return f"{self.tag(self.partition(flow_id))}:packing:{flow_id}"

    def order(self, order_id: str) -> str:
        """Hash: ``flow`` = the flow waiting on this gateway order; ``tokens`` live in :meth:`tokens`."""
        return f"{self.tag(self.partition(order_id))}:order:{order_id}"

    def tokens(self, order_id: str) -> str:
        return f"{self.tag(self.partition(order_id))}:tokens:{order_id}"

    def event(self, event_id: str) -> str:
        return f"{self.tag(self.partition(event_id))}:event:{event_id}"

    # -- gateway targets: keyed by the gateway order id, in its own partition (workflows.engine.targets) --------

    def target(self, target: str) -> str:
        """Hash: the flow whose money call on gateway order ``target`` may be unresolved (``flow``, its
        hold's ``token``): at most one at a time (``workflows.engine.targets``)."""
        return f"{self.tag(self.partition(target))}:target:{target}"

    def target_waiters(self, target: str) -> str:
        """Sorted set of the flows whose money call on ``target`` waits for its holder (woken when it lets go)."""
        return f"{self.tag(self.partition(target))}:waiters:{target}"

    def paused(self, partition: int) -> str:
        """Hash flow kind -> its pause (JSON), the partition's copy for the scripts (``workflows.pauses``)."""
        return f"{self.tag(partition)}:paused"

    def held(self, partition: int) -> str:
        """Sorted set of ``<kind>\\x1f<flow id>`` (scores 0): flows a pause held, per kind by a lex range."""
        return f"{self.tag(partition)}:held"

    def pauses(self) -> str:
        """Hash flow kind -> its pause (JSON): the pauses in force, which every partition's copy follows."""
        return f"{self.prefix}:pauses"

    def pause_log(self) -> str:
        """List of pauses and resumes (JSON, newest first, capped): who, when, why."""
        return f"{self.prefix}:pause_log"

    def fair_running(self, key: str) -> str:
        """Sorted set flow id -> when its admission lapses: the steps of a capped fairness key running or
        sent (``workflows.engine.fairness.Caps``). One slot per key, with its held set."""
        return f"{self.prefix}:{{fair:{key}}}:running"

    def fair_held(self, key: str) -> str:
        """Sorted set flow id -> when held: the flows a capped fairness key's cap holds back, oldest first."""
        return f"{self.prefix}:{{fair:{key}}}:held"

    def fair_owner(self, key: str) -> str:
        """Hash flow id -> the token of the claim holding its place in ``fair_running`` (none: sent, not
        yet claimed): a release gives back its own claim's place only. In the same slot."""
        return f"{self.prefix}:{{fair:{key}}}:owner"

    def fair_active(self) -> str:
        """Sorted set fairness key -> when one of its steps was last sent (with caps only): the keys a capped
        key shares its cap with (``workflows.engine.fairness.Caps.cap_now``), trimmed as written."""
        return f"{self.prefix}:fair:active"

    def counter(self, name: str) -> str:
        return f"{self.prefix}:count:{name}"

    def terminals(self) -> str:
        """The set of terminals other than ``default`` that flows were started on (``workflows.engine.terminals``)."""
        return f"{self.prefix}:terminals"

    def heartbeat(self, role: str) -> str:
        return f"{self.prefix}:alive:{role}"


def derived_id(prefix: str, *parts: str) -> str:
    """A stable id from ``parts`` (a start key, a schedule occurrence): same parts, same id."""
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]
    return f"{prefix}{digest}"


def step_idempotency_key(flow_id: str, step: str) -> str:
    """One key per (flow, step), never per attempt; at most 63 characters as the gateway requires."""
    key = f"{flow_id}.{step}"
    if len(key) <= 63:
        return key
    return "k" + hashlib.sha256(key.encode()).hexdigest()[:62]
