"""What a moment shown to a person looks like (``workflows.moments``): the tests of every surface check
what they print against it."""

from __future__ import annotations

import re

#: ISO 8601 to the second with its offset: UTC written ``Z``, an object's own zone named after the offset.
RULE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:Z|[+-]\d\d:\d\d \([A-Za-z_/+-]+\))$")
#: Anything that looks like a date and a time, with whatever follows it that could belong to it.
TIMES = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(?::\d\d(?:\.\d+)?)?(?:Z|[+-]\d\d:\d\d)?(?: UTC| \([^)\t]*\))?")


def off_rule(text: str) -> list[str]:
    """The moments in ``text`` not written by the rule (fails when ``text`` shows none at all)."""
    found = TIMES.findall(text)
    assert found, f"no time in:\n{text}"
    return [moment for moment in found if not RULE.match(moment)]
