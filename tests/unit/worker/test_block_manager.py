"""Block manager: exact reference counts, prefix sharing, eviction order, and the accounting invariant."""

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


def seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, 0, tokens, SamplingParams(max_tokens=8), 8, make_generator(0))


def prefill(bm: BlockManager, s: Sequence) -> list[int]:
    """Admit s as the scheduler would, compute all its tokens, register its full blocks."""
    hits = bm.match_prefix(s)
    num_new = s.num_tokens - len(hits) * BS
    bm.allocate(s, num_new, hits)
    s.num_computed_tokens += num_new
    bm.register_computed_blocks(s)
    return hits


def test_allocation_and_free_counts():
    bm = BlockManager(8, BS)
    a = seq(list(range(10)))  # 3 blocks
    prefill(bm, a)
    assert len(a.block_table) == 3 and bm.num_used_blocks == 3
    assert [bm.blocks[b].ref_count for b in a.block_table] == [1, 1, 1]
    bm.check_invariants()
    bm.free(a)
    # The two full blocks stay cached; the partial one goes straight back to the free list.
    assert bm.num_used_blocks == 0 and bm.num_cached_free_blocks == 2 and bm.num_free_blocks == 8
    bm.check_invariants()


def test_holds_says_when_allocate_would_take_no_block():
    bm = BlockManager(8, BS)
    a = seq(list(range(10)))  # 10 tokens computed in 3 blocks of 4: room for 2 more
    prefill(bm, a)
    assert bm.holds(a, 1) and bm.holds(a, 2) and not bm.holds(a, 3)
    before = list(a.block_table)
    bm.allocate(a, 2)
    assert a.block_table == before  # what holds() promised
    bm.allocate(a, 3)
    assert len(a.block_table) == 4


def test_prefix_sharing_reference_counts():
    bm = BlockManager(16, BS)
    a = seq(list(range(12)) + [100])  # 3 full blocks + 1
    prefill(bm, a)
    b = seq(list(range(12)) + [200, 201], "b")
    hits = prefill(bm, b)
    assert hits == a.block_table[:3]
    assert [bm.blocks[x].ref_count for x in a.block_table[:3]] == [2, 2, 2]
    assert b.num_computed_tokens == 14 and b.block_table[:3] == a.block_table[:3]
    assert b.block_table[3] != a.block_table[3]
    bm.free(a)
    assert [bm.blocks[x].ref_count for x in b.block_table[:3]] == [1, 1, 1]
    bm.check_invariants()


def test_last_token_is_never_a_hit():
    bm = BlockManager(16, BS)
    prefill(bm, seq(list(range(8))))
    again = seq(list(range(8)), "again")
    assert bm.match_prefix(again) == bm.match_prefix(seq(list(range(8)), "x"))
    assert len(bm.match_prefix(again)) == 1  # 8 tokens: only the first block, the last token must run


def test_divergent_prefix_stops_matching():
    bm = BlockManager(16, BS)
    prefill(bm, seq([1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert len(bm.match_prefix(seq([1, 2, 3, 4, 5, 6, 7, 0, 9], "x"))) == 1
    assert bm.match_prefix(seq([0, 2, 3, 4, 5, 6, 7, 8, 9], "y")) == []
    # Equal block contents at a different place in the prefix are not the same block.
    assert bm.match_prefix(seq([5, 6, 7, 8, 1, 2, 3, 4, 9], "z")) == []


def test_generated_blocks_match_only_their_own_sequence():
    """A block holding generated tokens is not the same bits as those tokens computed as a prompt: another
    request whose prompt repeats them (a chat's next turn) does not take it, while the sequence itself, computed
    again after a preemption, does; the prompt's own blocks are shared either way."""
    bm = BlockManager(16, BS)
    a = seq(list(range(6)))  # prompt: block 0 and half of block 1
    prefill(bm, a)
    a.token_ids += [50, 51, 52, 53, 54]  # generated: the rest of block 1, all of block 2 and one more
    bm.allocate(a, 5)
    a.num_computed_tokens += 5
    bm.register_computed_blocks(a)
    next_turn = seq(list(a.token_ids) + [60], "next")
    assert bm.match_prefix(next_turn) == a.block_table[:1]
    again = seq(list(range(6)), "a-again")  # a itself, preempted: same prompt, same outputs
    again.token_ids += [50, 51, 52, 53, 54]
    assert bm.match_prefix(again) == a.block_table[:2]  # all full blocks but the one holding its last token
    later = seq(list(range(6)) + [50, 51, 52, 53, 54, 55, 56], "b")
    later.num_prompt_tokens = 8  # a prompt that ends inside block 1 later than a's: block 1 differs
    assert bm.match_prefix(later) == a.block_table[:1]


def test_lru_eviction_order():
    bm = BlockManager(4, BS)
    a, b = seq([1] * 4 + [0], "a"), seq([2] * 4 + [0], "b")
    prefill(bm, a)
    prefill(bm, b)
    a_full, b_full = a.block_table[0], b.block_table[0]
    bm.free(a)  # a's block becomes cached first: it is the least recently freed
    bm.free(b)
    assert bm.num_cached_free_blocks == 2
    c = seq(list(range(10, 22)) + [0], "c")  # 4 blocks: two truly free, then evicts a's, then b's
    bm.allocate(c, c.num_tokens)
    assert c.block_table[2:] == [a_full, b_full]
    assert bm.match_prefix(seq([1] * 4 + [0], "a2")) == []
    bm.check_invariants()


def test_hit_on_cached_free_block_revives_it():
    bm = BlockManager(4, BS)
    a = seq([7] * 8 + [1])
    prefill(bm, a)
    bm.free(a)
    assert bm.num_cached_free_blocks == 2
    b = seq([7] * 8 + [3], "b")
    hits = prefill(bm, b)
    assert len(hits) == 2 and bm.num_cached_free_blocks == 0
    assert all(bm.blocks[h].ref_count == 1 for h in hits)
    bm.check_invariants()


def test_can_allocate_counts_revived_blocks():
    bm = BlockManager(3, BS)
    a = seq([7] * 8 + [1])
    prefill(bm, a)
    bm.free(a)  # 2 cached-free, 1 free
    b = seq([7] * 8 + [3] * 5, "b")  # hits 2 blocks, needs 2 more: only 1 left after reviving
    hits = bm.match_prefix(b)
    assert len(hits) == 2 and not bm.can_allocate(b, 5, hits)
    c = seq([7] * 8 + [3], "c")
    assert bm.can_allocate(c, 1, bm.match_prefix(c))


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_invariant_under_random_finish_abort_preempt(test_seed, prefix_caching):
    """Random mix of admissions, decode growth, finishes, aborts and preemptions via the real scheduler."""
    rng = random.Random(test_seed)
    bm = BlockManager(24, BS, enable_prefix_caching=prefix_caching)
    sched = Scheduler(bm, max_num_seqs=6, max_num_batched_tokens=16)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
    live: list[Sequence] = []
    for step in range(400):
        if rng.random() < 0.3:
            toks = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
            s = seq(toks, f"s{step}")
            sched.add(s)
            live.append(s)
        workload.step(sched, bm, rng, live)
        assert bm.num_used_blocks == sum(1 for b in bm.blocks if b.ref_count > 0)
        refs = {}
        for s in sched.running:
            for b in s.block_table:
                refs[b] = refs.get(b, 0) + 1
        assert all(bm.blocks[b].ref_count == n for b, n in refs.items())
        assert sum(b.ref_count for b in bm.blocks) == sum(refs.values())
    for s in live:
        sched.finish(s, "abort")
    bm.check_invariants()
    assert bm.num_used_blocks == 0
    assert sched.num_preemptions > 0, "the random workload was meant to force preemptions"
