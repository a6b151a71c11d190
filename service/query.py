"""Query parameters are merchant input too: an unknown one is refused, not ignored.

Why: ``POST /flows/moto?runat=+2h`` (``run_at`` misspelt) was answered 201 and the payment ran at once,
and ``GET /flows?stat=failed`` listed every flow as if filtered. FastAPI ignores query parameters a
route does not declare; this dependency, on every control API route, refuses them with the closest
known name, before the route does anything.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from durapay.gateway._strict import did_you_mean
from durapay.service.errors import invalid


def _declared(dependant: Any) -> frozenset[str]:
    """The query parameter names a route takes, its dependencies' included."""
    names: set[str] = set()
    pending = [dependant]
    while pending:
        current = pending.pop()
        names.update(param.alias for param in current.query_params)
        pending.extend(current.dependencies)
    return frozenset(names)


def refuse_unknown_query(request: Request) -> None:
    """422 ``query.<name>`` for a query parameter the route does not take."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = _declared(dependant)  # a handful of parameters: read each time rather than cached globally
    for name in request.query_params:
        if name not in known:
            takes = f" (this route takes: {', '.join(sorted(known))})" if known else " (this route takes none)"
            raise invalid(f"query.{name}", "unknown query parameter" + did_you_mean(name, known) + takes)
