"""Recurring merchant-initiated charges on schedules, with dunning.

A schedule charges a contract (``contractId``, amount in minor units, currency, description) by a rule
(every N days, monthly on day D, weekly on a weekday, a cron expression) in an IANA time zone, from a
start to an optional end or count. Every occurrence starts an ``mit`` flow through the engine under a
key derived from (schedule, occurrence), so it is charged once however many schedulers run; declines
are retried on the schedule's dunning policy; a hard decline stops it in ``needs_attention``.

Modules: ``rules`` (pure calendar arithmetic), ``model`` (input, states, record), ``policy`` (pure
decisions: firing, missed occurrences, dunning, operator actions, among them ``resolve``: what the
gateway shows for an occurrence whose flow is gone), ``store`` (Redis layout and Lua),
``api`` (:class:`Schedules`: the Python API and the scheduler's ``tick``)::

    from durapay.workflows.schedules import Schedules
    schedules = Schedules(engine)
    schedules.create({...}, key="gym-42")
    Dispatcher(engine, tickers=[schedules.tick]).start()
"""

from durapay.workflows.schedules.api import Schedules
from durapay.workflows.schedules.model import (
    COUNTERS,
    DEFAULT_DUNNING,
    Attempt,
    Resolution,
    ScheduleInput,
    ScheduleRecord,
    ScheduleState,
)
from durapay.workflows.schedules.policy import MISSED_GRACE, MIT_KIND, occurrence_key, order_id, order_parts
from durapay.workflows.schedules.rules import Calendar, Cron, EveryDays, Monthly, Rule, Weekly, occurrences, upcoming

__all__ = [
    "COUNTERS",
    "DEFAULT_DUNNING",
    "MISSED_GRACE",
    "MIT_KIND",
    "Attempt",
    "Calendar",
    "Cron",
    "EveryDays",
    "Monthly",
    "Resolution",
    "Rule",
    "ScheduleInput",
    "ScheduleRecord",
    "ScheduleState",
    "Schedules",
    "Weekly",
    "occurrence_key",
    "occurrences",
    "order_id",
    "order_parts",
    "upcoming",
]
