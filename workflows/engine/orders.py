"""The order index: which flow a gateway order belongs to, and the security tokens of its notifications.

The gateway names an order, never a flow: a notification carries ``operation.orderId`` and the
``securityToken`` of the session that made it. Per gateway order id this keeps (in the order id's own
partition, see ``keys``):

* ``order:<orderId>`` - hash, ``flow`` = the flow that made (or will make) the order;
* ``tokens:<orderId>`` - set of the security tokens the gateway gave for it.

A flow may make several orders (``<orderId>``, then ``<orderId>-2`` after an answer lost before the
customer could use the session, ``-3`` after an operator's restart): every one keeps pointing at the
flow, because a payment on *any* order the flow made is money the flow must account for. The record
lists them (``FlowRecord.orders``), so they expire with it, card data or not.

Every lookup that names a flow from outside lives exactly as long as the flow (:class:`Lookups`): its
order lookups and tokens, and the ``op:<operationId>`` lookups of the gateway operations it recorded
(the console's search; ``transition.lua`` writes them, listed in the record's ``ops``). None expires
while the flow is going, however long (a link open for months, a flow waiting for a person); once it
has finished, the dispatcher's packing pass gives them the record's end (:meth:`OrderIndex.expire`, never
shorter than an end they have), and a flow that comes back (a late payment, a retry) keeps them again
(:meth:`OrderIndex.keep`), by its mover or by the next pass (``workflows.engine.compact``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from durapay.workflows.engine.keys import Keys

#: How many derived order ids a flow tries, each held by another flow, before it stops for a person.
MAX_DERIVED = 20


@dataclass(frozen=True)
class Lookups:
    """What names one flow from outside: the gateway order ids it made and the operation ids it recorded."""

    flow_id: str
    orders: tuple[str, ...] = ()
    operations: tuple[str, ...] = ()

    @classmethod
    def of(cls, fields: Mapping[str, str]) -> Lookups:
        """The lookups a record's fields list (``orders``, else ``order_id``; ``ops``)."""
        orders = json.loads(fields.get("orders") or "[]") or ([fields["order_id"]] if fields.get("order_id") else [])
        return cls(fields["id"], tuple(orders), tuple(json.loads(fields.get("ops") or "[]")))

    def keys(self, keys: Keys) -> list[str]:
        """Every key of these lookups: per order its flow and tokens, per operation its flow."""
        found = [key for order_id in self.orders for key in (keys.order(order_id), keys.tokens(order_id))]
        partition = keys.partition(self.flow_id)
        return found + [keys.operation(partition, operation_id) for operation_id in self.operations]


class OrderIdsTaken(Exception):
    """Every derived order id a flow tried is another flow's (``OrderIndex.take``)."""


def gateway_order_id(base: str, seq: int, max_length: int) -> str:
    """The gateway order id of attempt ``seq``: ``base`` first, then ``base-2``, ``base-3``, at most
    ``max_length`` characters (the gateway's limit, ``DURAPAY_GATEWAY__ORDER_ID_MAX_LENGTH``), so a long
    ``base`` is cut: two bases may then give the same id, which ``OrderIndex.take`` never lets two flows
    hold."""
    if seq <= 0:
        return base
    suffix = f"-{seq + 1}"
    return base[: max_length - len(suffix)] + suffix


class OrderIndex:
    """Reads and writes the order lookups. Give it a Redis client, the key layout and the retention."""

    def __init__(self, client: redis.Redis, keys: Keys, retention_seconds: float, max_length: int) -> None:
        self.redis: Any = client
        self.keys = keys
        self.retention_seconds = retention_seconds
        #: The gateway's longest order id: every derived id fits it.
        self.max_length = max_length

    def flow_for(self, order_id: str) -> str | None:
        value: Any = self.redis.hget(self.keys.order(order_id), "flow")
        return value.decode() if value else None

    def tokens(self, order_id: str) -> list[str]:
        members: Any = self.redis.smembers(self.keys.tokens(order_id))
        return [token.decode() for token in members]

    def lookup(self, order_id: str) -> tuple[str | None, list[str]]:
        """The flow and the kept tokens of the order, in one round trip (what the receiver needs)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.keys.order(order_id), "flow")
        pipe.smembers(self.keys.tokens(order_id))
        flow, tokens = pipe.execute()
        return (flow.decode() if flow else None), [token.decode() for token in tokens]

    def point(self, order_id: str, flow_id: str) -> None:
        """Route notifications of ``order_id`` to ``flow_id`` (an order this flow makes)."""
        self.redis.hset(self.keys.order(order_id), "flow", flow_id)

    def take(self, base: str, seq: int, flow_id: str) -> tuple[int, str]:
        """(seq, order id) of the first derived order id from attempt ``seq`` on that no other flow holds,
        now held by ``flow_id``: a derived order id is one flow's only, whatever its merchant order id
        (two ids that differ only in their last two characters may share ``-2``; a merchant's own id may look like
        another's derived one). One the flow holds already is its own (a completion Redis lost, run again).
        Raises OrderIdsTaken after :data:`MAX_DERIVED` ids held by others."""
        for candidate in range(seq, seq + MAX_DERIVED):
            order_id = gateway_order_id(base, candidate, self.max_length)
            if self.redis.hsetnx(self.keys.order(order_id), "flow", flow_id) or self.flow_for(order_id) == flow_id:
                return candidate, order_id
        raise OrderIdsTaken(
            f"order ids {gateway_order_id(base, seq, self.max_length)} to "
            f"{gateway_order_id(base, seq + MAX_DERIVED - 1, self.max_length)} are other flows'"
        )

    def claim(self, order_id: str, flow_id: str) -> bool:
        """Point ``order_id`` at ``flow_id`` unless another flow holds it; whether ``flow_id`` holds it now.
        A gateway order id is one flow's for as long as its lookup lives (until the retention after that
        flow ended): a start naming a held one is refused (``create.lua`` on a single server, which makes
        this move in the start's own round trip; ``Engine.start`` first asks on a cluster, where this runs
        after the create and a start racing another for the same id may lose: it then holds no lookup,
        and proves nothing on that order its own: ``workflows.flows._adopt``)."""
        return bool(self.redis.hsetnx(self.keys.order(order_id), "flow", flow_id)) or self.flow_for(order_id) == flow_id

    def claim_many(self, pairs: list[tuple[str, str]]) -> None:
        """:meth:`claim` for many (order id, flow id) pairs, in one round trip."""
        if not pairs:
            return
        pipe = self.redis.pipeline(transaction=False)
        for order_id, flow_id in pairs:
            pipe.hsetnx(self.keys.order(order_id), "flow", flow_id)
        pipe.execute()

    def keep_token(self, order_id: str, flow_id: str, output: Mapping[str, Any]) -> None:
        """Keep the security token of a step's answer, so the receiver can verify the order's notifications."""
        token = output.get("securityToken")
        if order_id and isinstance(token, str) and token:
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(self.keys.tokens(order_id), token)
            pipe.hsetnx(self.keys.order(order_id), "flow", flow_id)  # never another flow's: it holds its own
            pipe.execute()

    def keep(self, lookups: Iterable[Lookups]) -> None:
        """A flow that came back from its end (a late payment, a retry) keeps its lookups until it ends again."""
        pipe = self.redis.pipeline(transaction=False)
        for found in lookups:
            for key in found.keys(self.keys):
                pipe.persist(key)
        pipe.execute()

    def expire(self, lookups: Lookups, seconds: int) -> None:
        """A finished flow's lookups (orders, tokens, operations) live as long as its record: ``seconds``
        more, or longer when they have that already (``EXPIRE NX``, then ``GT``: an end is given, or
        moved later, never earlier; Redis and Valkey 7 or later, as ``WAITAOF`` needs)."""
        ttl = max(1, int(seconds))
        pipe = self.redis.pipeline(transaction=False)
        for key in lookups.keys(self.keys):
            pipe.expire(key, ttl, nx=True)
            pipe.expire(key, ttl, gt=True)
        pipe.execute()
