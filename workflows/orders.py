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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import redis

from workflows.keys import Keys

#: The gateway's longest order id.
MAX_ORDER_ID = 27


def gateway_order_id(base: str, seq: int) -> str:
    """The gateway order id of attempt ``seq``: ``base`` first, then ``base-2``, ``base-3`` (27 characters max)."""
    if seq <= 0:
        return base
    suffix = f"-{seq + 1}"
    return base[: MAX_ORDER_ID - len(suffix)] + suffix


class OrderIndex:
    """Reads and writes the order lookups. Give it a Redis client, the key layout and the retention."""

    def __init__(self, client: redis.Redis, keys: Keys, retention_seconds: float) -> None:
        self.redis: Any = client
        self.keys = keys
        self.retention_seconds = retention_seconds

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

    def claim(self, order_id: str, flow_id: str, *, holder_live: Any) -> None:
        """Point ``order_id`` at ``flow_id`` unless a live flow holds it. A start that merely *names* an
        order id never takes it from another live flow (``holder_live(flow_id) -> bool``): the gateway
        will refuse the second order and that flow moves to ``<orderId>-2``; the first keeps its
        notifications. On a single server ``create.lua`` makes the first move (the HSETNX) in the
        start's own round trip; this runs only when it could not (a cluster, a lookup held)."""
        key = self.keys.order(order_id)
        if self.redis.hsetnx(key, "flow", flow_id):
            return
        holder = self.flow_for(order_id)
        if holder is None or (holder != flow_id and not holder_live(holder)):
            self.redis.hset(key, "flow", flow_id)

    def claim_many(self, pairs: list[tuple[str, str]], *, holder_live: Any) -> None:
        """:meth:`claim` for many (order id, flow id) pairs: one round trip, plus one per order id that a
        flow already held (rare: a merchant naming an order id twice)."""
        if not pairs:
            return
        pipe = self.redis.pipeline(transaction=False)
        for order_id, flow_id in pairs:
            pipe.hsetnx(self.keys.order(order_id), "flow", flow_id)
        for (order_id, flow_id), taken in zip(pairs, pipe.execute(), strict=True):
            if not taken:
                self.claim(order_id, flow_id, holder_live=holder_live)

    def keep_token(self, order_id: str, flow_id: str, output: Mapping[str, Any]) -> None:
        """Keep the security token of a step's answer, so the receiver can verify the order's notifications."""
        token = output.get("securityToken")
        if order_id and isinstance(token, str) and token:
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(self.keys.tokens(order_id), token)
            pipe.hset(self.keys.order(order_id), "flow", flow_id)
            pipe.execute()

    def keep(self, order_ids: Iterable[str]) -> None:
        """A flow that came back from its end (a late payment) keeps its order lookups until it ends again."""
        pipe = self.redis.pipeline(transaction=False)
        for order_id in order_ids:
            pipe.persist(self.keys.order(order_id))
            pipe.persist(self.keys.tokens(order_id))
        pipe.execute()

    def expire(self, order_ids: Iterable[str]) -> None:
        """A finished flow's order lookups (flow, tokens) live as long as its record."""
        ttl = max(1, int(self.retention_seconds))
        pipe = self.redis.pipeline(transaction=False)
        for order_id in order_ids:
            pipe.expire(self.keys.order(order_id), ttl)
            pipe.expire(self.keys.tokens(order_id), ttl)
        pipe.execute()
