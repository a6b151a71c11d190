"""durapay: durable payment flows on Celery and Redis; nothing lost, nothing charged twice.

The public API (README, "From Python"):

* :func:`connect` gives the engine (start, get, wait, list, history, signal, cancel, retry) on the flow
  store the ``DURAPAY_*`` settings name, for a backend on the workers' Redis;
* the flow states, the errors those calls raise, and the settings model.

Everything else (``durapay.workflows``, ``durapay.gateway``, ...) is the implementation: importable,
documented, but not promised to stay as it is.
"""

from importlib.metadata import PackageNotFoundError, version

from durapay.config.settings import Settings, SettingsError, load_settings
from durapay.service.runtime import connect
from durapay.workflows.durability import EarlyWaitaof, NotDurable
from durapay.workflows.engine import Engine, InputError, NotFound, OrderIdTaken
from durapay.workflows.errors import OperatorError
from durapay.workflows.states import STOPPED, TERMINAL, FlowState
from durapay.workflows.store import FlowRecord, StartConflict

try:
    __version__ = version("durapay")
except PackageNotFoundError:  # a checkout on sys.path, not installed
    __version__ = "0+unknown"

__all__ = [
    "STOPPED",
    "TERMINAL",
    "EarlyWaitaof",
    "Engine",
    "FlowRecord",
    "FlowState",
    "InputError",
    "NotDurable",
    "NotFound",
    "OperatorError",
    "OrderIdTaken",
    "Settings",
    "SettingsError",
    "StartConflict",
    "__version__",
    "connect",
    "load_settings",
]
