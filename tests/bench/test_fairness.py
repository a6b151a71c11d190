"""A short run of the fairness benchmark (``bench/bench_fairness.py``): a trickle of one key behind a
queued backlog of another, on a real worker process, with fairness on and then off. Only what cannot
flake is asserted: how many backlog flows were claimed between a trickle flow's start and its claim (a
few with fairness on, where the worker takes the key's queues in turn; most of the backlog without it,
first in first out). The times are printed, never asserted."""

from __future__ import annotations

from bench.bench_fairness import parser, report, run

BACKLOG = 200
CONCURRENCY = 3


def test_a_trickle_is_not_queued_behind_another_keys_backlog() -> None:
    args = parser().parse_args(
        ["--backlog", str(BACKLOG), "--trickle", "6", "--gap", "0.05", "--concurrency", str(CONCURRENCY), "--compare-off"]
    )
    phases = run(args, lambda _: None)
    report(phases)
    fair, unfair = phases["backlog"], phases["backlog, fairness off"]
    assert fair.backlog_left and fair.backlog_left > 0, "the backlog outlasted the trickle"
    # Fairness on, the bulk key capped at two of three threads: a trickle flow waits for at most the
    # steps already running or reserved, never for the queue.
    assert max(fair.between) <= 3 * CONCURRENCY, fair.between
    # Off: the first trickle flow waited behind (nearly) the whole queue.
    assert unfair.between[0] >= BACKLOG // 4, unfair.between
    assert len(fair.waits) == len(unfair.waits) == 6
