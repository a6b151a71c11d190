"""Flows and the durable engine that runs them: the Redis record is the truth, Celery the fast path.

``Engine`` is the Python API (start, get, list, history, signal, cancel, retry, wait) and the worker
side (claim, run, complete a step); ``Dispatcher`` sends what the ``due`` set says is due;
``flows.REGISTRY`` names every flow kind. See ``engine`` for the step protocol and ``store`` for the
record's layout.
"""

from durapay.workflows.clock import Clock, ManualClock, OffsetClock, SystemClock
from durapay.workflows.dispatcher import Dispatcher
from durapay.workflows.engine import Claim, Engine, InputError, NotFound, OperatorError, StartConflict
from durapay.workflows.states import STOPPED, TERMINAL, FlowState
from durapay.workflows.store import FlowRecord

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
