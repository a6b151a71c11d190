"""Flows and the durable engine that runs them: the Redis record is the truth, Celery the fast path.

``Engine`` is the Python API (start, get, list, history, signal, cancel, retry, wait) and the worker
side (claim, run, complete a step); ``Dispatcher`` sends what the ``due`` set says is due;
``flows.REGISTRY`` names every flow kind. See ``engine`` for the step protocol and ``store`` for the
record's layout.
"""

from typing import TYPE_CHECKING

from durapay._lazy import lazy_names

if TYPE_CHECKING:
    from durapay.workflows.clock import Clock, ManualClock, OffsetClock, SystemClock
    from durapay.workflows.dispatcher import Dispatcher
    from durapay.workflows.engine import Claim, Engine, InputError, NotFound, OperatorError, StartConflict
    from durapay.workflows.states import STOPPED, TERMINAL, FlowState
    from durapay.workflows.store import FlowRecord

#: Loaded on first use (durapay/_lazy.py): importing one module of the package loads no other.
_HOMES = {
    "Clock": "durapay.workflows.clock",
    "ManualClock": "durapay.workflows.clock",
    "OffsetClock": "durapay.workflows.clock",
    "SystemClock": "durapay.workflows.clock",
    "Dispatcher": "durapay.workflows.dispatcher",
    "Claim": "durapay.workflows.engine",
    "Engine": "durapay.workflows.engine",
    "InputError": "durapay.workflows.engine",
    "NotFound": "durapay.workflows.engine",
    "OperatorError": "durapay.workflows.engine",
    "StartConflict": "durapay.workflows.engine",
    "STOPPED": "durapay.workflows.states",
    "TERMINAL": "durapay.workflows.states",
    "FlowState": "durapay.workflows.states",
    "FlowRecord": "durapay.workflows.store",
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
