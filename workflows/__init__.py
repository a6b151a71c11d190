"""Flows and the durable engine that runs them: the Redis record is the truth, Celery the fast path.

``Engine`` is the Python API (start, get, list, history, signal, cancel, retry, wait) and the worker
side (claim, run, complete a step); ``Dispatcher`` sends what the ``due`` set says is due;
``flows.REGISTRY`` names every flow kind. See ``engine`` for the step protocol and ``store`` for the
record's layout.
"""

from typing import TYPE_CHECKING

from durapay._lazy import lazy_names

if TYPE_CHECKING:
    from durapay.workflows.engine import (
        STOPPED,
        TERMINAL,
        Claim,
        Clock,
        Dispatcher,
        Engine,
        FlowRecord,
        FlowState,
        InputError,
        ManualClock,
        NotFound,
        OffsetClock,
        OperatorError,
        StartConflict,
        SystemClock,
    )

#: Loaded on first use (durapay/_lazy.py): importing one module of the package loads no other.
_HOMES = {
    "Clock": "durapay.workflows.engine.clock",
    "ManualClock": "durapay.workflows.engine.clock",
    "OffsetClock": "durapay.workflows.engine.clock",
    "SystemClock": "durapay.workflows.engine.clock",
    "Dispatcher": "durapay.workflows.engine.dispatcher",
    "Claim": "durapay.workflows.engine.api",
    "Engine": "durapay.workflows.engine.api",
    "InputError": "durapay.workflows.engine.api",
    "NotFound": "durapay.workflows.engine.api",
    "OperatorError": "durapay.workflows.engine.api",
    "StartConflict": "durapay.workflows.engine.api",
    "STOPPED": "durapay.workflows.engine.states",
    "TERMINAL": "durapay.workflows.engine.states",
    "FlowState": "durapay.workflows.engine.states",
    "FlowRecord": "durapay.workflows.engine.store",
}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)

__all__ = [
    "STOPPED",
    "TERMINAL",
    "Claim",
    "Clock",
    "Dispatcher",
    "Engine",
    "FlowRecord",
    "FlowState",
    "InputError",
    "ManualClock",
    "NotFound",
    "OffsetClock",
    "OperatorError",
    "StartConflict",
    "SystemClock",
]
