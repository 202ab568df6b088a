"""The KV cache audit: silent on correct accounting, and every kind of broken accounting is found, names the
requests involved, and is repaired so that the block manager's invariants hold again and no block is ever
handed out twice."""

from __future__ import annotations

import random

import pytest

from shared.sampling_params import SamplingParams
from worker.core.block_manager import BlockManager
from worker.core.kv_audit import FAULT_KINDS, KvAuditor, inject_fault
from worker.core.sequence import Sequence
from worker.runner.sampler import make_generator

BS = 4


def seq(tokens: list[int], rid: str) -> Sequence:
    return Sequence(rid, 0, tokens, SamplingParams(max_tokens=8), 8, make_generator(0))


def prefill(bm: BlockManager, s: Sequence) -> None:
    hits = bm.match_prefix(s)
    num_new = s.num_tokens - len(hits) * BS
    bm.allocate(s, num_new, hits)
    s.num_computed_tokens += num_new
    bm.register_computed_blocks(s)


def busy_manager(num_blocks: int = 32) -> tuple[BlockManager, list[Sequence]]:
    """Live sequences sharing a prefix, and cached blocks left behind by a finished one."""
    bm = BlockManager(num_blocks, BS)
    shared = list(range(8))
    live = [seq(shared + [100 + i] * 5, f"r{i}") for i in range(3)]
    for s in live:
        prefill(bm, s)
    gone = seq(list(range(50, 62)), "gone")
    prefill(bm, gone)
    bm.free(gone)
    bm.check_invariants()
    assert bm.num_cached_free_blocks > 0 and bm.num_used_blocks > 0
    return bm, live


def test_silent_on_correct_accounting_under_random_traffic():
    rng = random.Random(0)
    bm = BlockManager(40, BS)
    audit = KvAuditor(bm)
    live: list[Sequence] = []
    for step in range(400):
        if live and (rng.random() < 0.4 or bm.num_free_blocks < 6):
            bm.free(live.pop(rng.randrange(len(live))))
        else:
            prefix = [1, 2, 3, 4, 5, 6, 7, 8][:rng.choice([0, 4, 8])]
            s = seq(prefix + [rng.randrange(9, 30) for _ in range(rng.randrange(1, 12))], f"s{step}")
            if bm.can_allocate(s, s.num_tokens, bm.match_prefix(s)):
                prefill(bm, s)
                live.append(s)
        assert audit.check(live).ok, step
    assert audit.num_violations == 0 and audit.num_checks == 400


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_injected_fault_is_found_and_repaired(kind):
    bm, live = busy_manager()
    used, cached = bm.num_used_blocks, bm.num_cached_free_blocks
    audit = KvAuditor(bm)
    assert audit.check(live).ok
    what = inject_fault(bm, kind, live)
    assert what.startswith(kind)
    if kind == "orphan":  # the only one the totals alone reveal; the others need the block tables
        with pytest.raises(AssertionError):
            bm.check_invariants()
    report = audit.check(live)
    assert not report.ok and audit.num_violations == 1
    assert report.problems and "block" in report.problems[0]
    if kind == "over_free":
        assert report.requests == {"r0"}  # the first live request, whose block was freed under it
        assert report.reclaimed_blocks == 0
    else:
        assert report.reclaimed_blocks == 1
    bm.check_invariants()
    assert audit.check(live).ok
    assert bm.num_used_blocks == used and bm.num_cached_free_blocks == cached


def test_leak_names_the_request_that_last_held_the_block():
    bm = BlockManager(8, BS)
    a = seq(list(range(6)), "leaky")
    prefill(bm, a)
    leaked = a.block_table[-1]  # the partial block: no digest, goes straight back to the free list
    bm.free(a)
    bm.blocks[leaked].ref_count = 1  # as if that free had been missed
    bm._free.remove(leaked)
    report = KvAuditor(bm).check([])
    assert report.requests == {"leaky"} and report.reclaimed_blocks == 1
    assert bm.num_used_blocks == 0
    bm.check_invariants()


def test_over_free_never_hands_a_live_block_out_twice():
    bm, live = busy_manager(num_blocks=16)
    inject_fault(bm, "over_free", live)
    victim = live[0].block_table[-1]
    KvAuditor(bm).check(live)
    # Take every free block: the live request's block is not among them.
    hog = seq(list(range(200, 200 + BS * bm.num_free_blocks)), "hog")
    bm.allocate(hog, hog.num_tokens)
    assert victim not in hog.block_table
    assert bm.num_free_blocks == 0


def test_duplicates_and_blocks_on_both_lists_are_repaired():
    bm, live = busy_manager()
    total_free = bm.num_free_blocks
    bm._free.append(bm._free[0])  # listed twice
    cached = next(iter(bm._cached_free))
    bm._free.append(cached)  # on both lists
    audit = KvAuditor(bm)
    report = audit.check(live)
    assert not report.ok and any("2 free lists" in p for p in report.problems)
    bm.check_invariants()
    assert bm.num_free_blocks == total_free and cached in bm._cached_free
    assert audit.check(live).ok


def test_interval_and_ledger():
    bm, live = busy_manager()
    audit = KvAuditor(bm, every_steps=4)
    results = [audit.after_step(live) for _ in range(8)]
    assert [r is not None for r in results] == [False, False, False, True] * 2
    assert audit.num_checks == 2
    ledger = audit.ledger({s.request_id: [s] for s in live})
    assert ledger["totals"]["used"] == bm.num_used_blocks
    assert ledger["totals"]["used"] + ledger["totals"]["cached_free"] + ledger["totals"]["free"] == 32
    r0 = ledger["requests"]["r0"][0]
    assert r0["blocks"] == live[0].block_table and r0["status"] == "waiting"
    # The two shared prefix blocks are held by all three live requests.
    assert r0["ref_counts"][:2] == [3, 3]
    assert ledger["shared_blocks"] == {str(b): 3 for b in live[0].block_table[:2]}
    assert ledger["audit"] == {"every_steps": 4, "steps": 8, "checks": 2, "violations": 0}
    with pytest.raises(ValueError):
        KvAuditor(bm, every_steps=0)
    with pytest.raises(ValueError, match="unknown fault"):
        inject_fault(bm, "nonsense", live)


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_engine_repairs_a_fault_mid_run_and_output_is_unchanged(tmp_path, test_seed, kind):
    from tests.helpers.engine_probe import make_engine
    from tests.helpers.tiny_models import build_tiny_model

    build_tiny_model("qwen3", test_seed, tmp_path / "m", vocab_size=320)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = [[(test_seed + 7 * i + j) % 300 + 3 for j in range(20 + 9 * i)] for i in range(3)]

    def run(fault: str | None) -> tuple[dict, object]:
        engine = make_engine(tmp_path / "m", num_kv_blocks=64, block_size=4, max_model_len=128)
        engine.kv_audit.every_steps = 1
        for i, p in enumerate(prompts):
            engine.add_request(f"q{i}", p, greedy)
        tokens: dict[str, list[int]] = {}
        for step in range(200):
            if not engine.has_unfinished_requests():
                break
            for out in engine.step():
                tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if step == 5 and fault:
                engine.inject_kv_fault(fault)
        return tokens, engine

    clean, clean_engine = run(None)
    tokens, engine = run(kind)
    assert clean_engine.kv_audit.num_violations == 0
    assert engine.kv_audit.num_violations == 1 and engine.stats().kv_invariant_violations == 1
    assert tokens == clean  # repaired before the broken block could be handed out again
    assert engine.block_manager.num_used_blocks == 0
    engine.block_manager.check_invariants()
    assert engine.kv_audit.check([]).ok
