"""One step of a random scheduler workload, shared by the block-manager and fair-scheduler tests."""

from __future__ import annotations

import random


def step(sched, bm, rng: random.Random, live: list) -> None:
    """Schedule once, compute what was scheduled (a finished prefill samples a random token), end some
    sequences at random (stop or abort; any past 40 tokens), drop the ended from `live`, check the
    block manager's invariants."""
    batch = sched.schedule()
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        s.num_computed_tokens += n
        bm.register_computed_blocks(s)
        if s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(rng.randrange(50))
    for s in list(live):
        r = rng.random()
        if r < 0.03 or s.num_tokens > 40:
            sched.finish(s, "stop")
        elif r < 0.05:
            sched.finish(s, "abort")
        if s.is_finished:
            live.remove(s)
    bm.check_invariants()
