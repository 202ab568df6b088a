"""vLLM's priority policy (worker/core/scheduler.py, worker/core/fair_queue.py) through the real scheduler and
block manager: admission by priority (lower first), fair share between API keys within one priority, the
lowest priority preempted first; and under fcfs every priority is the same."""

from __future__ import annotations

import random

import pytest

from shared.sampling_params import SamplingParams
from tests.helpers import scheduler_workload as workload
from worker.core.block_manager import BlockManager
from worker.core.scheduler import Scheduler
from worker.core.sequence import Sequence
from worker.runner.sampler import make_generator

BS = 4


def seq(rid: str, priority: int = 0, tenant: str = "", num_tokens: int = 4) -> Sequence:
    return Sequence(rid, 0, [7] * num_tokens, SamplingParams(max_tokens=8, priority=priority), 8, make_generator(0),
                    tenant, 1.0)


def scheduler(policy: str, max_num_seqs: int = 1, blocks: int = 64) -> Scheduler:
    return Scheduler(BlockManager(blocks, BS, enable_prefix_caching=False), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=64, policy=policy)


def admission_order(sched: Scheduler, count: int) -> list[str]:
    """With one running slot: schedule, take what was admitted, finish it after its prefill."""
    order = []
    for _ in range(count):
        batch = sched.schedule()
        assert len(batch) == 1
        order.append(batch.seqs[0].request_id)
        sched.finish(batch.seqs[0], "stop")
    return order


PRIORITIES = {"p5": 5, "p0a": 0, "p3": 3, "p0b": 0, "m1": -1}


@pytest.mark.parametrize("policy, expected", [("priority", ["m1", "p0a", "p0b", "p3", "p5"]),
                                              ("fcfs", ["p5", "p0a", "p3", "p0b", "m1"])])
def test_admission_order(policy, expected):
    sched = scheduler(policy)
    for rid, priority in PRIORITIES.items():
        sched.add(seq(rid, priority))
    assert admission_order(sched, len(PRIORITIES)) == expected


def test_a_preempted_sequence_goes_back_to_the_head_of_its_priority():
    sched = scheduler("priority")
    low_old, high = seq("low-old", 2), seq("high", 1)
    sched.add(low_old)
    sched.add(high)
    sched.add_front([seq("low-back", 2)])  # e.g. requeued: first among the 2s, still after every 1
    assert admission_order(sched, 3) == ["high", "low-back", "low-old"]


def test_priority_first_then_fair_share_between_keys():
    """A flooding key and a light one at priority 1, and one late urgent request at 0 from the flooding key:
    the urgent one goes first; then the two keys alternate (the flood does not starve the light key),
    however many the flood queued first."""
    sched = scheduler("priority")
    for i in range(6):
        sched.add(seq(f"flood{i}", 1, "flood"))
    for i in range(3):
        sched.add(seq(f"light{i}", 1, "light"))
    sched.add(seq("urgent", 0, "flood"))
    order = admission_order(sched, 10)
    assert order[0] == "urgent"
    light = [i for i, rid in enumerate(order) if rid.startswith("light")]
    # The urgent request charged the flooding key, so the light key leads the equal-priority share.
    assert light == [1, 3, 5], order
    assert order[2::2][:2] == ["flood0", "flood1"] and order[6:] == ["flood2", "flood3", "flood4", "flood5"]


def decode_until_preemption(sched: Scheduler, bm: BlockManager) -> list[str]:
    """Prefill everything, then decode (one token per sequence per step) until the first preemption; the
    preempted sequences' ids."""
    for _ in range(64):
        batch = sched.schedule()
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            s.num_computed_tokens += n
            bm.register_computed_blocks(s)
            if s.num_computed_tokens == s.num_tokens:
                s.token_ids.append(1)
        if sched.num_preemptions:
            return [s.request_id for s in sched.waiting]
    raise AssertionError("no preemption")


@pytest.mark.parametrize("policy, victim", [("priority", "low"), ("fcfs", "last")])
def test_the_lowest_priority_is_preempted_first(policy, victim):
    """Three sequences of one full block each in a cache of four blocks: at their first decode the first to ask
    takes the free block and the second to ask preempts one: under priority the lowest priority (highest
    number), though it was admitted first; under fcfs the most recently admitted."""
    bm = BlockManager(4, BS, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=3, max_num_batched_tokens=64, policy=policy)
    for rid, priority in (("low", 9), ("high", 0), ("last", 1)):
        sched.add(seq(rid, priority, num_tokens=4))
    assert decode_until_preemption(sched, bm) == [victim]
    assert victim not in [s.request_id for s in sched.running]
    bm.check_invariants()


def test_running_sequences_get_blocks_in_priority_order():
    """Under priority the running list is kept in (priority, arrival) order, whatever the admission order."""
    sched = scheduler("priority", max_num_seqs=4)
    for rid, priority in (("c", 3), ("a", 1), ("d", 3), ("b", 2)):
        sched.add(seq(rid, priority))
    sched.schedule()
    assert [s.request_id for s in sched.running] == ["a", "b", "c", "d"]


def test_block_accounting_holds_with_priorities_and_preemption(test_seed):
    rng = random.Random(test_seed)
    bm = BlockManager(24, BS)
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=16, policy="priority")
    live: list[Sequence] = []
    for step in range(400):
        if rng.random() < 0.4:
            s = Sequence(f"s{step}", 0, [rng.randrange(50) for _ in range(rng.randrange(1, 14))],
                         SamplingParams(max_tokens=8, priority=rng.randrange(-2, 3)), 8, make_generator(0),
                         rng.choice("ab"), 1.0)
            sched.add(s)
            live.append(s)
        workload.step(sched, bm, rng, live)
        assert len(sched.waiting) + len(sched.running) == len(live)
        assert [(s.params.priority, s.arrival_order) for s in sched.running] == sorted(
            (s.params.priority, s.arrival_order) for s in sched.running)
    for s in live:
        sched.finish(s, "abort")
    bm.check_invariants()
    assert bm.num_used_blocks == 0 and sched.num_preemptions > 0
