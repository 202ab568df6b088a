"""Continuous batching: which sequences run this step, and how many of their tokens.

One token budget per step (max_num_batched_tokens) shared by decodes and prefill chunks, at most
max_num_seqs sequences running. Running sequences go first, in admission order; waiting ones are
admitted while budget and KV blocks last, weighted-fair between tenants (API keys) and
first-come-first-served within each (worker/core/fair_queue.py; with one tenant, plain FCFS). Every token
scheduled is charged to its tenant. When a running sequence needs a block and none is free, the most
recently admitted running sequence is preempted: its blocks are freed and it goes back to the head of
its tenant's queue, to be recomputed (its full blocks usually come back as prefix-cache hits).

Under `--scheduling-policy priority` (vLLM's), waiting sequences are admitted by priority first (lower
first; fair between tenants within one priority), and the running ones are kept in priority order (then
arrival): they get the step's budget and blocks in that order, and the one preempted when blocks run out is
the lowest priority (highest number), the latest arrival among equals. Admission never preempts, as in
vLLM: a waiting high-priority sequence takes the next blocks that come free.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field

from worker.core.block_manager import BlockManager
from worker.core.fair_queue import FairQueue
from worker.core.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # tokens each sequence feeds this step

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "fcfs"):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.by_priority = policy == "priority"  # shared/config.py's SCHEDULING_POLICIES
        self.waiting = FairQueue(self.by_priority)
        self.running: list[Sequence] = []
        # Counters the engine reports as metrics.
        self.num_preemptions = 0
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq, self.running)

    def add_front(self, seqs: list[Sequence]) -> None:
        for seq in reversed(seqs):
            self.waiting.appendleft(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        preempted_any = False
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if seq.draft_token_ids:
                num_new = self._with_drafts(seq, num_new, budget)
            # Most decode steps fit the blocks the sequence holds: nothing to allocate, no one to preempt.
            if not self.block_manager.holds(seq, num_new):
                while not self.block_manager.can_allocate(seq, num_new):
                    victim = self.running[-1]
                    self._preempt(victim)
                    preempted_any = True
                    if victim is seq:
                        break
                if seq.status is not SequenceStatus.RUNNING:
                    continue
                self.block_manager.allocate(seq, num_new)
            self.waiting.charge(seq, num_new)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        # Admitting new work while evicting running work would thrash; wait for blocks to come back.
        if not preempted_any:
            budget = self._admit_waiting(batch, budget)
        return batch

    def _with_drafts(self, seq: Sequence, num_new: int, budget: int) -> int:
        """A decoding sequence with speculative drafts feeds them too, as far as the budget and the free
        blocks reach: drafts are cut first, and never preempt anyone."""
        if num_new != 1:  # not decoding (cannot happen while the engine drafts only for decodes)
            seq.draft_token_ids.clear()
            return num_new
        del seq.draft_token_ids[max(0, budget - 1):]
        while seq.draft_token_ids and not self.block_manager.can_allocate(seq, 1 + len(seq.draft_token_ids)):
            seq.draft_token_ids.pop()
        return 1 + len(seq.draft_token_ids)

    def _admit_waiting(self, batch: ScheduledBatch, budget: int) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.peek()
            # A prompt being scored or pooled over must be computed whole; it neither looks up nor counts as a query.
            looks_up = not seq.computes_whole_prompt
            hits = self.block_manager.match_prefix(seq) if looks_up else []
            num_new = min(seq.num_tokens - len(hits) * self.block_manager.block_size, budget)
            if not self.block_manager.can_allocate(seq, num_new, hits):
                break
            self.waiting.remove(seq)
            self.block_manager.allocate(seq, num_new, hits)
            self.waiting.charge(seq, num_new)
            if seq.num_cached_prompt_tokens is None:
                seq.num_cached_prompt_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)
                seq.queue_time = time.monotonic() - seq.arrival_time
            if looks_up:
                self.prefix_query_tokens += seq.num_tokens
                self.prefix_hit_tokens += seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            if self.by_priority:  # kept in (priority, arrival) order: the last is the one to preempt first
                bisect.insort(self.running, seq, key=_priority_rank)
            else:
                self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        return budget

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.draft_token_ids.clear()
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Finish seq in any state and release its blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason


def _priority_rank(seq: Sequence) -> tuple[int, int]:
    return seq.params.priority, seq.arrival_order or 0
