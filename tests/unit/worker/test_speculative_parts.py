"""worker/spec/'s parts alone: the n-gram lookup, the acceptance rule, the turn-down of a sequence whose
drafts keep failing, and the gateway's series built from workers' running totals."""

from __future__ import annotations

import random

from gateway.metrics.mili_metrics import Metrics
from shared import wire
from worker.spec.acceptance import (MAX_MIN_ACCEPTANCE, MAX_PAUSE_STEPS, MIN_ACCEPTANCE, PAUSE_STEPS, PROBE_TOKENS,
                                    STEP_COST_IN_ROWS, AcceptanceTracker, EngineAcceptance, crowded, min_acceptance)
from worker.spec.ngram import NgramProposer
from worker.spec.verify import num_emitted


def test_lookup_takes_the_longest_suffix_at_its_latest_occurrence():
    lookup = NgramProposer(1, 3)
    assert lookup.propose([1, 2, 3, 4, 2, 3], 4) == [4, 2, 3]
    # [2, 3] occurs twice before the end: the later occurrence (followed by 9) wins.
    assert lookup.propose([2, 3, 7, 2, 3, 9, 5, 2, 3], 2) == [9, 5]
    # The 3-token suffix [5, 2, 3] beats the 1- and 2-token ones.
    assert lookup.propose([5, 2, 3, 8, 2, 3, 6, 5, 2, 3], 1) == [8]
    assert lookup.propose([1, 2, 3], 4) == []  # nothing recurs
    assert NgramProposer(2, 3).propose([4, 1, 5, 1], 3) == []  # only a 1-token match, below the minimum
    # A match must be whole tokens, not bytes straddling two of them.
    assert NgramProposer(1, 1).propose([256, 1, 0, 1], 2) == [0, 1]
    assert lookup.propose([7, 7, 7, 7], 8) == [7]  # the continuation ends at the sequence's end


class _Tokens:
    def __init__(self, token_ids: list[int]):
        self.token_ids = token_ids


def test_a_crowded_batch_looks_up_only_the_longest_ngrams():
    lookup = NgramProposer(1, 3)
    short = _Tokens([2, 3, 9, 4, 2, 3])  # only a 2-token suffix recurs
    long = _Tokens([5, 2, 3, 8, 1, 5, 2, 3])  # a 3-token one does
    assert lookup.propose_many([(short, 2), (long, 2)]) == [[9, 4], [8, 1]]
    assert lookup.propose_many([(short, 2), (long, 2)], crowded=True) == [[], [8, 1]]


def test_acceptance_rule():
    assert num_emitted([4, 5, 6], [4, 5, 6, 9]) == 4  # all accepted, plus the bonus token
    assert num_emitted([4, 5, 6], [4, 8, 6, 9]) == 2  # the target's token replaces the first rejected draft
    assert num_emitted([4], [1, 4]) == 1


def test_turn_down_pauses_failing_speculation_longer_each_time():
    tracker = AcceptanceTracker()
    pauses = []
    for _ in range(3):
        while tracker.may_draft():  # drafts until MIN_JUDGED rejected tokens make it pause
            tracker.record(4, 0)
        skipped = 1
        while not tracker.may_draft():
            skipped += 1
        pauses.append(skipped)
        tracker.record(4, 0)
    assert pauses == [PAUSE_STEPS, 2 * PAUSE_STEPS, 4 * PAUSE_STEPS]
    # A retry that pays resets the pause; a sequence whose drafts are accepted never pauses.
    tracker.record(4, 4)
    tracker.record(4, 4)
    assert tracker._next_pause == PAUSE_STEPS
    good = AcceptanceTracker()
    for _ in range(100):
        assert good.may_draft()
        good.record(4, 2)
    assert MAX_PAUSE_STEPS >= 4 * PAUSE_STEPS


def test_draft_length_follows_the_accepted_runs():
    tracker = AcceptanceTracker()
    assert tracker.draft_length(5) == PROBE_TOKENS  # nothing known yet: a probe
    tracker.record(PROBE_TOKENS, PROBE_TOKENS)  # the probe accepted: the full k next
    assert tracker.draft_length(5) == 5
    for _ in range(2):
        tracker.record(5, 5)  # off probation now: a window of 11 accepted tokens
    for _ in range(6):
        tracker.record(tracker.draft_length(5), 1)
        assert tracker.may_draft()  # half or more accepted at the end: no pause alone
    assert tracker.draft_length(5) == 2  # runs of one accepted token: draft two
    for _ in range(6):
        n = tracker.draft_length(5)
        tracker.record(n, n)  # every draft accepted: the length grows back to k
    assert tracker.draft_length(5) == 5


def test_a_failed_probe_pauses_and_a_lucky_token_does_not_reset_the_backoff():
    tracker = AcceptanceTracker()
    tracker.record(1, 0)  # the first probe rejected: a pause at once, not a window of drafts first
    assert [tracker.may_draft() for _ in range(PAUSE_STEPS + 1)] == [False] * PAUSE_STEPS + [True]
    assert tracker.draft_length(5) == PROBE_TOKENS  # after a pause, a probe again
    tracker.record(1, 1)  # a lucky probe: drafting resumes ...
    while tracker.may_draft():
        tracker.record(tracker.draft_length(5), 0)  # ... and fails its window
    skipped = 1 + sum(1 for _ in iter(lambda: tracker.may_draft(), True))
    assert skipped == 2 * PAUSE_STEPS  # the backoff kept growing: only a window that pays resets it
    assert tracker.draft_length(5) == PROBE_TOKENS


def test_probation_ends_once_a_window_pays():
    quoted = AcceptanceTracker()
    quoted.record(1, 1)  # the probe
    quoted.record(5, 5)
    quoted.record(5, 5)  # 11 accepted: a window of MIN_JUDGED that pays
    quoted.record(5, 0)  # off probation, one rejected draft is judged with the window (11 of 16 accepted)
    assert quoted.may_draft()
    fresh = AcceptanceTracker()
    fresh.record(1, 1)
    fresh.record(5, 0)  # on probation, the same rejection pauses
    assert not fresh.may_draft()


def _simulate(acceptance: float, num_decoding: int, steps: int = 128, k: int = 5, seed: int = 0) -> tuple[int, int]:
    """One sequence under the rule for `steps` decode steps, each drafted token accepted with probability
    `acceptance` (a draft stops at its first rejection): (rows drafted, tokens emitted)."""
    rng, tracker, engine = random.Random(seed), AcceptanceTracker(), EngineAcceptance()
    drafted = emitted = 0
    for _ in range(steps):
        emitted += 1
        if not tracker.may_draft():
            continue
        n = tracker.draft_length(k, min_acceptance(num_decoding), engine.chance())
        accepted = next((i for i in range(n) if rng.random() >= acceptance), n)
        tracker.record(n, accepted, min_acceptance(num_decoding))
        engine.record(n, accepted)
        drafted, emitted = drafted + n, emitted + accepted
    return drafted, emitted


def _modeled_speedup(acceptance: float, num_decoding: int, seed: int, tokens: int = 128, k: int = 5) -> float:
    """Plain decoding's time over speculation's for one sequence of `tokens` beside num_decoding - 1 others,
    in the rule's own cost model: a step costs STEP_COST_IN_ROWS + rows (in rows' compute), shared by the
    sequences in it, so a sequence's step costs STEP_COST_IN_ROWS / n plus its own rows."""
    rng, tracker, bar = random.Random(seed), AcceptanceTracker(), min_acceptance(num_decoding)
    engine = EngineAcceptance()  # the others draft alike: this sequence's drafts stand for the engine's
    emitted, cost = 0, 0.0
    while emitted < tokens:
        rows, emitted = 1, emitted + 1
        if tracker.may_draft() and emitted < tokens:
            n = min(tracker.draft_length(k, bar, engine.chance()), tokens - emitted)
            accepted = next((i for i in range(n) if rng.random() >= acceptance), n)
            tracker.record(n, accepted, bar)
            engine.record(n, accepted)
            rows, emitted = rows + n, emitted + accepted
        cost += STEP_COST_IN_ROWS / num_decoding + rows
    return tokens * (STEP_COST_IN_ROWS / num_decoding + 1) / cost


def test_the_rule_pays_in_its_own_cost_model():
    # Unguessable text (10-50% of drafted tokens accepted): within 5% of plain decoding at every batch size
    # (the probes' rows); quoted text (95%): twice as fast alone, a quarter faster beside 3 others.
    for c in (1, 4, 16, 32):
        for acceptance in (0.1, 0.25, 0.5):
            speedups = [_modeled_speedup(acceptance, c, seed) for seed in range(20)]
            assert sum(speedups) / len(speedups) > 0.95, (c, acceptance, speedups)
    for c, least in ((1, 1.9), (4, 1.2), (16, 0.98)):
        speedups = [_modeled_speedup(0.95, c, seed) for seed in range(20)]
        assert sum(speedups) / len(speedups) > least, (c, speedups)


def test_unguessable_text_costs_few_rows_and_guessable_text_keeps_its_drafts():
    for c in (1, 4, 16):
        # Open-ended text (a quarter of drafted tokens accepted): under 15% more rows than plain decoding
        # (the rule before probes drafted 33-48 rows here).
        rows = [_simulate(0.25, c, seed=s)[0] for s in range(20)]
        assert sum(rows) / len(rows) < 0.15 * 128, (c, rows)
    # Quoted text (95% accepted): several tokens a step, fewer beside others, where the bar is higher.
    for c, least in ((1, 4), (4, 3), (16, 1.8)):
        emitted = [_simulate(0.95, c, seed=s)[1] for s in range(10)]
        assert sum(emitted) / len(emitted) > least * 128, (c, emitted)


def _stats(**spec) -> wire.WorkerStats:
    return wire.WorkerStats(num_running=0, num_waiting=0, kv_blocks_total=1, kv_blocks_used=0,
                            prefix_cache_query_tokens=0, prefix_cache_hit_tokens=0, num_preemptions=0, **spec)


def test_gateway_series_add_workers_increases():
    metrics = Metrics("m")
    first = _stats(spec_num_drafts=3, spec_num_draft_tokens=12, spec_num_accepted_tokens=6,
                   spec_accepted_per_position=[3, 2, 1, 0], spec_acceptance_histogram=[0, 1, 1, 1, 0])
    metrics.worker_counters(None, first)
    # A restarted worker starts from zero again: its new totals add on, nothing goes backwards.
    metrics.worker_counters(None, _stats(spec_num_drafts=1, spec_num_draft_tokens=4, spec_num_accepted_tokens=4,
                                         spec_accepted_per_position=[1, 1, 1, 1],
                                         spec_acceptance_histogram=[0, 0, 0, 0, 1]))
    text = metrics.render().decode()
    assert 'vllm:spec_decode_num_drafts_total{model_name="m"} 4.0' in text
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 16.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 10.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 4.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="3"} 1.0' in text
    assert 'mili_spec_decode_accepted_tokens_per_draft_bucket{le="0.0",model="m"} 0.0' in text
    assert 'mili_spec_decode_accepted_tokens_per_draft_bucket{le="4.0",model="m"} 4.0' in text
    assert 'mili_spec_decode_accepted_tokens_per_draft_sum{model="m"} 10.0' in text


def test_a_bigger_batch_asks_for_more_acceptance():
    assert min_acceptance(1) == MIN_ACCEPTANCE
    assert MIN_ACCEPTANCE < min_acceptance(4) < min_acceptance(16) <= MAX_MIN_ACCEPTANCE
    assert min_acceptance(16) == 16 / (16 + STEP_COST_IN_ROWS)  # where a drafted row pays back its compute
    assert not crowded(min_acceptance(1)) and crowded(min_acceptance(4))
    alone, busy = AcceptanceTracker(), AcceptanceTracker()
    for _ in range(4):
        alone.record(4, 2, min_acceptance(1))  # half accepted: worth it alone
        busy.record(4, 2, min_acceptance(16))  # not beside 15 others
    assert alone.may_draft() and not busy.may_draft()


def test_an_accepted_probe_drafts_k_alone_and_grows_from_two_in_a_crowd():
    alone, crowd = AcceptanceTracker(), AcceptanceTracker()
    for tracker in (alone, crowd):
        assert tracker.draft_length(5) == PROBE_TOKENS
        tracker.record(PROBE_TOKENS, PROBE_TOKENS)
    assert alone.draft_length(5, min_acceptance(1)) == 5
    assert crowd.draft_length(5, min_acceptance(16)) == PROBE_TOKENS + 1
    crowd.record(2, 2, min_acceptance(16))
    # A whole draft accepted counts as a run of 3: draft 4, where the engine's drafts are mostly accepted
    # (quoted text); where they are not, each further row would not pay beside 15 others: one.
    assert crowd.draft_length(5, min_acceptance(16), prior=0.97) == 4
    assert crowd.draft_length(5, min_acceptance(16), prior=0.5) == 1


def test_the_engine_prior_follows_its_recent_drafts():
    engine = EngineAcceptance()
    assert engine.chance() == 0.5
    for _ in range(50):
        engine.record(5, 5)
    assert engine.chance() > 0.97  # 250 accepted, none rejected
    for _ in range(600):
        engine.record(3, 1)  # a token accepted, then one rejected: the recent drafts outweigh the old
    assert abs(engine.chance() - 0.5) < 0.02
