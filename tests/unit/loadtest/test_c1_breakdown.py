"""The concurrency-1 breakdown's stage clock: a wrapped method still returns its result, and each call is
recorded under its stage, in wall and in CPU time."""

from __future__ import annotations

import time

from loadtest.c1_breakdown import StageClock


def test_wrapped_methods_are_timed_and_still_answer():
    class Worker:
        def work(self, x):
            deadline = time.thread_time() + 0.002
            while time.thread_time() < deadline:  # burn CPU, so both clocks move
                pass
            return 2 * x

    clock, worker = StageClock(), Worker()
    clock.wrap(worker, "work", "work")
    assert [worker.work(i) for i in range(3)] == [0, 2, 4]
    assert len(clock.wall["work"]) == len(clock.cpu["work"]) == 3
    assert all(c >= 0.002 for c in clock.cpu["work"]) and all(w >= c * 0.5 for w, c in zip(clock.wall["work"],
                                                                                           clock.cpu["work"]))
