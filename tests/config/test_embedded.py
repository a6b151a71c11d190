"""``free_port``: a port for a server to bind in a moment, outside the range outgoing connections take theirs from."""

from __future__ import annotations

import socket
from pathlib import Path

from durapay.config import embedded
from durapay.config.embedded import LOWEST_PORT, ephemeral_range, free_port


def test_ports_lie_below_the_ephemeral_range_and_are_never_handed_out_twice() -> None:
    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(LOWEST_PORT <= port < low for port in ports), ports


def test_a_port_a_listener_holds_is_skipped() -> None:
    before = set(embedded._handed_out)
    chosen = free_port()
    embedded._handed_out.clear()
    embedded._handed_out.update(before)  # the next call starts its walk where the last one did: at ``chosen``
    with socket.create_server(("127.0.0.1", chosen)):
        assert free_port() != chosen


def test_the_range_is_read_from_the_kernel_and_defaults_to_linux_s(tmp_path: Path) -> None:
    narrow = tmp_path / "range"
    narrow.write_text("40000\t60999\n")
    assert ephemeral_range(narrow) == (40000, 60999)
    assert ephemeral_range(tmp_path / "absent") == (32768, 60999)
