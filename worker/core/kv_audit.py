"""The KV cache checking itself: the block manager's accounting audited against the live block tables,
and repaired in place when it is wrong.

What must hold between steps (the block tables of live sequences are the truth):
- every block's reference count equals the number of live block tables that hold it;
- a block nobody holds sits in exactly one of the free list and the cached-free list, a held block in
  neither; so used + cached-free + free == total.

A violation (an accounting bug: a missed free, a double free, a block lost from the lists) is logged
with the requests involved, counted, and repaired: reference counts are set to what the tables say and
the free lists are rebuilt, so leaked and orphaned blocks come back and nothing is handed out twice.
Serving goes on. The audit is the block manager's own consistency check kept in a module of its own;
it reads and rebuilds the manager's lists directly.

The check costs O(total blocks) in C-level list and set operations (see `KV_AUDIT_EVERY_STEPS` for the
measured cost and the chosen interval).
"""

from __future__ import annotations

import logging
import operator
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain

from shared.wire import KV_FAULT_KINDS
from worker.core.block_manager import BlockManager
from worker.core.sequence import Sequence

log = logging.getLogger(__name__)

_ref_count = operator.attrgetter("ref_count")

FAULT_KINDS = KV_FAULT_KINDS

# One audit of the default model's 1 GiB cache (2,912 blocks) took 0.5-1.1 ms on a busy 2-core machine
# (loadtest/bench_kv_audit.py), 2-5% of a 20 ms batch-1 decode step; every 8th step brings it to about 0.1 ms
# a step on average (~0.5%), and a broken count is still caught within a fraction of a second.
KV_AUDIT_EVERY_STEPS = 8


@dataclass
class AuditReport:
    """What one audit found (empty `problems`: the accounting was right)."""

    problems: list[str] = field(default_factory=list)
    requests: set[str] = field(default_factory=set)  # requests whose blocks were involved
    reclaimed_blocks: int = 0  # blocks that came back to the free lists

    @property
    def ok(self) -> bool:
        return not self.problems


class KvAuditor:
    """Audits a BlockManager every `every_steps` steps and repairs what it finds."""

    def __init__(self, block_manager: BlockManager, every_steps: int = 1):
        if every_steps < 1:
            raise ValueError(f"every_steps must be at least 1, got {every_steps}")
        self.bm = block_manager
        self.every_steps = every_steps
        self.num_steps = 0
        self.num_checks = 0
        self.num_violations = 0  # audits that found something, since start

    def after_step(self, seqs: Iterable[Sequence]) -> AuditReport | None:
        self.num_steps += 1
        if self.num_steps % self.every_steps:
            return None
        return self.check(seqs)

    def check(self, seqs: Iterable[Sequence]) -> AuditReport:
        seqs = list(seqs)
        self.num_checks += 1
        expected = _expected_ref_counts(self.bm.num_blocks, seqs)
        if _consistent(self.bm, expected):
            return AuditReport()
        report = self._diagnose(expected, seqs)
        report.reclaimed_blocks = self._repair(expected)
        self.num_violations += 1
        log.error("KV cache accounting violated (requests involved: %s): %s; repaired, %d blocks reclaimed",
                  ", ".join(sorted(report.requests)) or "none live", "; ".join(report.problems),
                  report.reclaimed_blocks)
        return report

    # ----- diagnosis (only runs once the cheap check failed) -----
    def _diagnose(self, expected: list[int], seqs: list[Sequence]) -> AuditReport:
        bm, report = self.bm, AuditReport()
        holders: dict[int, list[str]] = {}
        for seq in seqs:
            for b in seq.block_table:
                holders.setdefault(b, []).append(f"{seq.request_id}#{seq.index}")
        free, cached = list(bm._free), bm._cached_free
        counts = Counter(free)
        for b, block in enumerate(bm.blocks):
            owners = holders.get(b, [])
            owner_text = ", ".join(owners) if owners else f"no live request (last held by {block.last_owner})"
            if block.ref_count != expected[b]:
                report.problems.append(f"block {b} has reference count {block.ref_count} but {expected[b]} "
                                       f"live tables hold it ({owner_text})")
            listed = counts.get(b, 0) + (b in cached)
            if expected[b] and listed:
                report.problems.append(f"block {b} is on a free list while held by {owner_text}")
            elif not expected[b] and listed != 1:
                report.problems.append(f"block {b} is held by no table but on {listed} free lists "
                                       f"(last held by {block.last_owner})")
            if block.ref_count != expected[b] or listed != (0 if expected[b] else 1):
                report.requests.update(o.split("#")[0] for o in owners)
                if block.last_owner is not None:
                    report.requests.add(block.last_owner)
        if not report.problems:  # counts agree block by block, so the totals cannot disagree; be explicit
            report.problems.append("free lists disagree with the block tables")
        return report

    # ----- repair -----
    def _repair(self, expected: list[int]) -> int:
        """Reference counts from the tables; free lists rebuilt from the blocks nobody holds, keeping the
        cached ones (digest intact and still indexed) in their LRU order."""
        bm = self.bm
        free_before = len(bm._free) + len(bm._cached_free)
        for block, count in zip(bm.blocks, expected):
            block.ref_count = count
        unheld = [b for b, count in enumerate(expected) if count == 0]
        unheld_set = set(unheld)
        cached: OrderedDict[int, None] = OrderedDict()
        for b in chain(bm._cached_free, unheld):
            block = bm.blocks[b]
            if b in unheld_set and b not in cached and block.digest is not None \
                    and bm._by_digest.get(block.digest) == b:
                cached[b] = None
        free: deque[int] = deque()
        for b in chain(bm._free, unheld):
            if b in unheld_set and b not in cached:
                unheld_set.discard(b)  # once: the list may have held it twice
                block = bm.blocks[b]
                if block.digest is not None and bm._by_digest.get(block.digest) == b:
                    del bm._by_digest[block.digest]
                block.digest, block.token_ids = None, None
                free.append(b)
        bm._cached_free, bm._free = cached, free
        for digest, b in list(bm._by_digest.items()):  # index entries of blocks that lost their digest
            if bm.blocks[b].digest != digest:
                del bm._by_digest[digest]
        return max(0, len(free) + len(cached) - free_before)

    # ----- ledger for /debug/kv -----
    def ledger(self, requests: dict[str, list[Sequence]]) -> dict:
        bm = self.bm
        refs = list(map(_ref_count, bm.blocks))
        return {
            "totals": {"blocks": bm.num_blocks, "block_size": bm.block_size, "used": bm.num_used_blocks,
                       "cached_free": bm.num_cached_free_blocks, "free": len(bm._free)},
            "requests": {rid: [{"index": s.index, "status": s.status.value, "blocks": list(s.block_table),
                                "ref_counts": [refs[b] for b in s.block_table],
                                "num_computed_tokens": s.num_computed_tokens, "num_tokens": s.num_tokens}
                               for s in seqs]
                         for rid, seqs in requests.items()},
            "shared_blocks": {str(b): c for b, c in enumerate(refs) if c > 1},
            "audit": {"every_steps": self.every_steps, "steps": self.num_steps, "checks": self.num_checks,
                      "violations": self.num_violations},
        }


def _expected_ref_counts(num_blocks: int, seqs: list[Sequence]) -> list[int]:
    expected = [0] * num_blocks
    for b, count in Counter(chain.from_iterable(s.block_table for s in seqs)).items():
        expected[b] = count
    return expected


def _consistent(bm: BlockManager, expected: list[int]) -> bool:
    """The cheap check: reference counts, and the free lists hold exactly the unheld blocks, once each.
    Every loop here runs in C (map, list compare, count, set)."""
    if list(map(_ref_count, bm.blocks)) != expected:
        return False
    free, cached = bm._free, bm._cached_free
    listed = len(free) + len(cached)
    if listed != expected.count(0):
        return False
    held = expected.__getitem__
    if any(map(held, free)) or any(map(held, cached)):
        return False
    # As many listed entries as unheld blocks, all unheld: equal sets unless one is listed twice.
    return len(set(chain(free, cached))) == listed


def inject_fault(bm: BlockManager, kind: str, seqs: Iterable[Sequence]) -> str:
    """Break the accounting on purpose (tests and drills, behind --enable-debug-faults); returns what was done.

    leak: a free block gets a reference nobody holds (a missed free);
    orphan: a free block drops off the free lists (neither free nor used);
    over_free: a block a live request holds loses its reference and goes on the free list (a double free).
    """
    if kind == "over_free":
        for seq in seqs:
            if seq.block_table:
                b = seq.block_table[-1]
                bm.blocks[b].ref_count -= 1
                if bm.blocks[b].ref_count == 0:
                    bm._free.append(b)
                return f"over_free: block {b} of {seq.request_id}#{seq.index}"
        kind = "leak"  # nothing live to break; fall back to a leak
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(FAULT_KINDS)}")
    if not bm._free:
        raise ValueError("no free block to break")
    b = bm._free.pop()
    if kind == "leak":
        bm.blocks[b].ref_count = 1
    return f"{kind}: block {b}"
