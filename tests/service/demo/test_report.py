"""The demo's closing notes: with ``--keep`` they name the console's URL and the key to sign in with."""

from __future__ import annotations

from durapay.service.demo.report import Places, next_steps

PLACES = Places("http://127.0.0.1:8780", "demo-key-123", "http://127.0.0.1:8781", "redis://127.0.0.1:1", "/d", "/d/logs")


def test_keep_prints_the_console_url_and_its_key() -> None:
    notes = next_steps(PLACES, keep=True)
    assert "http://127.0.0.1:8780/console" in notes and "demo-key-123" in notes


def test_without_keep_the_notes_point_at_keep() -> None:
    notes = next_steps(PLACES, keep=False)
    assert "durapay demo --keep" in notes and "demo-key-123" not in notes
