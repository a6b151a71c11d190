"""Process wiring that is not covered through the commands: the start-up heap taken out of the GC."""

from __future__ import annotations

import gc
import weakref

from service.runtime import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.me = self


def test_start_up_objects_are_frozen_and_later_cycles_are_still_collected() -> None:
    made_before = _Node()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        tracked = (gc.get_objects(generation) for generation in range(3))
        assert not any(item is made_before for objects in tracked for item in objects), "collections skip it"
        later = _Node()
        gone = weakref.ref(later)
        del later
        gc.collect()
        assert gone() is None, "a cycle made after the freeze is collected as before"
    finally:
        gc.unfreeze()
