"""Weighted-fair admission between tenants (worker/core/fair_queue.py) through the real scheduler and block manager."""

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


def seq(rid: str, tenant: str = "", weight: float = 1.0, num_tokens: int = 4) -> Sequence:
    return Sequence(rid, 0, [7] * num_tokens, SamplingParams(max_tokens=8), 8, make_generator(0), tenant, weight)


def scheduler(max_num_seqs: int = 1, blocks: int = 64) -> Scheduler:
    return Scheduler(BlockManager(blocks, BS, enable_prefix_caching=False), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=64)


def admit_one_at_a_time(sched: Scheduler, count: int) -> list[Sequence]:
    """With one running slot: schedule, take what was admitted, finish it after its prefill."""
    order = []
    for _ in range(count):
        batch = sched.schedule()
        assert len(batch) == 1
        order.append(batch.seqs[0])
        sched.finish(batch.seqs[0], "stop")
    return order


@pytest.mark.parametrize("weights", [(3.0, 1.0), (1.0, 1.0), (2.0, 5.0)])
def test_admissions_follow_the_weights(weights):
    wa, wb = weights
    sched = scheduler()
    for i in range(200):  # interleaved arrivals: FCFS would alternate A, B, A, B
        sched.add(seq(f"a{i}", "A", wa))
        sched.add(seq(f"b{i}", "B", wb))
    order = [s.tenant for s in admit_one_at_a_time(sched, 80)]
    share_a = wa / (wa + wb)
    # Equal prompts: each admission costs the same tokens, so admissions split in proportion to the weights,
    # over every window, not only on average (within one request of the exact share).
    for end in range(8, 81, 8):
        assert abs(order[:end].count("A") - share_a * end) <= 1, (end, order[:end])


def test_one_tenant_is_first_come_first_served_with_requeues_at_the_head():
    sched = scheduler()
    seqs = [seq(f"s{i}") for i in range(6)]
    for s in seqs[:4]:
        sched.add(s)
    sched.add_front([seqs[4], seqs[5]])  # e.g. choices released after their leader's prefill
    assert [s.request_id for s in admit_one_at_a_time(sched, 6)] == ["s4", "s5", "s0", "s1", "s2", "s3"]


def test_a_flood_does_not_starve_a_late_tenant():
    sched = scheduler(max_num_seqs=2)
    flood = [seq(f"f{i}", "flood") for i in range(50)]
    for s in flood:
        sched.add(s)
    for _ in range(5):  # the flood holds both slots and decodes
        batch = sched.schedule()
        for s, n in zip(batch.seqs, batch.num_new_tokens):
            s.num_computed_tokens += n
            if s.num_computed_tokens == s.num_tokens:
                s.token_ids.append(1)
    late = seq("late", "other")
    sched.add(late)
    assert sched.waiting.service("other") == sched.waiting.service("flood")  # lifted: no banked credit
    sched.schedule()  # the flood's two running sequences are charged another token each
    sched.finish(sched.running[0], "stop")  # a slot frees
    batch = sched.schedule()
    assert late in batch.seqs, "the waiting tenant that was served least goes next, not the flood's 3rd request"


def test_a_returning_tenant_cannot_claim_credit_for_its_idle_time():
    sched = scheduler()
    for i in range(30):
        sched.add(seq(f"a{i}", "A"))
    admit_one_at_a_time(sched, 20)  # A alone: its counter runs up to 80 tokens
    for i in range(30):
        sched.add(seq(f"b{i}", "B"))
    order = [s.tenant for s in admit_one_at_a_time(sched, 10)]
    assert order.count("B") <= 6, f"B was lifted to A's counter, so they alternate: {order}"


def test_counters_start_over_when_nothing_waits_or_runs():
    sched = scheduler()
    sched.add(seq("a0", "A"))
    admit_one_at_a_time(sched, 1)
    assert sched.waiting.service("A") == 4
    sched.add(seq("b0", "B"))
    assert sched.waiting.service("B") == 0 and sched.waiting.service("A") is None


def test_waiting_queue_membership_and_removal_across_tenants():
    sched = scheduler(max_num_seqs=1)
    a, b, c = seq("a", "A"), seq("b", "B"), seq("c", "A")
    for s in (a, b, c):
        sched.add(s)
    assert len(sched.waiting) == 3 and all(s in sched.waiting for s in (a, b, c))
    sched.finish(b, "abort")
    assert b not in sched.waiting and len(sched.waiting) == 2
    assert [s.request_id for s in admit_one_at_a_time(sched, 2)] == ["a", "c"]
    assert not sched.waiting and not sched.has_work()


def test_block_accounting_holds_with_tenants_and_preemption(test_seed):
    """Random admissions from three weighted tenants, decode growth, finishes, aborts and preemptions."""
    rng = random.Random(test_seed)
    bm = BlockManager(24, BS)
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=16)
    tenants = {"a": 1.0, "b": 2.5, "c": 0.5}
    live: list[Sequence] = []
    for step in range(400):
        if rng.random() < 0.4:
            name = rng.choice(list(tenants))
            s = Sequence(f"s{step}", 0, [rng.randrange(50) for _ in range(rng.randrange(1, 14))],
                         SamplingParams(max_tokens=8), 8, make_generator(0), name, tenants[name])
            sched.add(s)
            live.append(s)
        workload.step(sched, bm, rng, live)
        assert len(sched.waiting) + len(sched.running) == len(live)
        assert all(s in sched.waiting for s in live if s not in sched.running)
    for s in live:
        sched.finish(s, "abort")
    bm.check_invariants()
    assert bm.num_used_blocks == 0
    assert sched.num_preemptions > 0, "the random workload was meant to force preemptions"
