"""Speculation's bookkeeping: one sequence's recent acceptance (which turns its speculation down when the
guesses stop paying), and the engine's cumulative counts (vLLM's spec_decode metrics).

A verification step costs more than a plain decode step (every drafted token is one more row through the
model), so a sequence whose drafts keep being rejected (open-ended text) would run slower than without
speculation. The rule, one per sequence: it starts on probation, and goes back on probation after every
pause. Its first draft on probation is a probe of PROBE_TOKENS (a failed one costs one row); once a probe is
accepted it drafts k again (2 in a crowded batch). On probation each draft is judged alone: one whose accepted
fraction is below min_acceptance (what a drafted row must reach to pay for itself, higher in a bigger batch)
pauses drafting for next_pause decode steps, which doubles on every pause (PAUSE_STEPS up to MAX_PAUSE_STEPS).
Probation ends when the last WINDOW drafted tokens hold at least MIN_JUDGED and meet min_acceptance; that
resets next_pause to PAUSE_STEPS. Off probation the window is what is judged (below the bar: a pause), and
drafts are one token longer than the recent accepted runs, and no longer than their rows pay for
(draft_length).
So a sequence that cannot be guessed pays a row per probe, and a few more after a lucky one, at pauses
that grow 8, 16, 32, ...; the rule before this one drafted until MIN_JUDGED tokens were judged after each
pause, and any accepted token reset its backoff (open-ended text ran at 0.87x of plain decoding at 4
sequences). Quoted text, whose drafts are accepted, leaves probation within two drafts.
"""

from __future__ import annotations

from collections import deque

WINDOW = 16  # drafted tokens the acceptance rate is judged over
MIN_JUDGED = 8  # ... once it holds at least this many
MIN_ACCEPTANCE = 0.3  # alone (min_acceptance raises it with the batch)
# A step's cost is about a + b * rows: a reads every weight once, b is one more row's compute. a / b, in rows:
# on a 2-core Zen 4 (SmolLM2-135M, Q4_1, loadtest/profile_step.py --batch 1..16): 4.3 ms alone, about 1.1-1.3
# ms a row more from 3 rows on. A machine whose rows are cheaper (AMX) would pay drafts back sooner.
STEP_COST_IN_ROWS = 2.5
MAX_MIN_ACCEPTANCE = 0.9
# A batch is crowded where a drafted row must be accepted more often than not to pay (about 2 sequences and
# more here). There an accepted probe is followed by PROBE_TOKENS + 1 drafts, not k (the accepted runs grow
# it from there), and prompt lookup drafts only from its longest n-grams (worker/spec/ngram.py).
CROWDED_ACCEPTANCE = 0.5
PROBE_TOKENS = 1  # the longest draft of a probe: a rejected probe costs one row
PAUSE_STEPS = 8
MAX_PAUSE_STEPS = 256
RUN_DECAY = 0.5  # weight of the past in the accepted-run average that sets the draft length
# A sequence's chance that a reached draft token is accepted starts from the engine's recent drafts, worth this
# many of its own tokens (EngineAcceptance); its own drafts since its last pause outweigh it as they come.
PRIOR_TOKENS = 8
ENGINE_DECAY = 0.99  # per draft, in the engine-wide counts


def crowded(min_acceptance: float) -> bool:
    return min_acceptance > CROWDED_ACCEPTANCE


def min_acceptance(num_decoding: int) -> float:
    """The acceptance below which a sequence stops drafting, with num_decoding (n) sequences decoding. With a
    step costing a + b * rows, a plain token costs a / n + b and a drafted row b; the row pays when the chance
    that it becomes a token is at least b / (a / n + b) = n / (n + a / b). Alone, the weights' read dominates
    and a third accepted pays; beside 15 others, nearly every drafted row must be accepted."""
    return min(MAX_MIN_ACCEPTANCE, max(MIN_ACCEPTANCE, num_decoding / (num_decoding + STEP_COST_IN_ROWS)))


class AcceptanceTracker:
    def __init__(self):
        self._recent: deque[bool] = deque(maxlen=WINDOW)  # accepted? per drafted token, latest last
        self._probation = True  # each draft judged alone (at the start and after every pause)
        self._pause = 0  # decode steps left without drafting
        self._next_pause = PAUSE_STEPS
        self._probe = True  # the next draft is a probe
        self._run = None  # moving average of the tokens accepted per draft (None: none since the last probe)
        self._reached = [0, 0]  # draft tokens accepted, and drafts with a rejected token, since the last pause

    def draft_length(self, k: int, min_acceptance: float = MIN_ACCEPTANCE, prior: float = 0.5) -> int:
        """How many tokens to draft, at most k: a probe's PROBE_TOKENS; after an accepted probe k, or in a
        crowded batch PROBE_TOKENS + 1; then one more than the recent accepted run, and no more than pay
        for their rows (_paying_length; prior: EngineAcceptance.chance), so that where every verified row
        costs nearly a decode row's compute, rejected rows stay few while long accepted runs grow the draft
        back to k."""
        if self._probe:
            return min(k, PROBE_TOKENS)
        if self._run is None:
            return min(k, PROBE_TOKENS + 1) if crowded(min_acceptance) else k
        return max(1, min(int(self._run) + 1, self._paying_length(k, min_acceptance, prior)))

    def _paying_length(self, k: int, min_acceptance: float, prior: float) -> int:
        """The longest draft, at most k, whose every row pays: token i of a draft becomes a token only if the i before it
        were accepted, about p^i for p the chance that a reached token is accepted, and a row pays at
        min_acceptance. p is estimated from the sequence's drafts since its last pause (rejections come in
        clusters, where quoted text was edited, so a short memory would overreact) and PRIOR_TOKENS of the
        engine's. At 74% a token beside 3 others (a bar of 62%) that is one token; quoted text (97%) drafts
        k beside 3 others and 4 beside 15."""
        accepted, rejected = self._reached
        p = (accepted + PRIOR_TOKENS * prior) / (accepted + rejected + PRIOR_TOKENS)
        length, reach = 0, p
        while reach >= min_acceptance and length < k:
            length, reach = length + 1, reach * p
        return max(1, length)

    def may_draft(self) -> bool:
        """Whether to draft this step (a paused sequence counts the step towards its pause)."""
        if self._pause > 0:
            self._pause -= 1
            return False
        return True

    def record(self, num_drafted: int, num_accepted: int, min_acceptance: float = MIN_ACCEPTANCE) -> None:
        # A fully accepted draft says nothing of how much longer the run would have gone: count it as one more.
        run = num_accepted + (num_accepted == num_drafted)
        if self._probe:  # an accepted probe says the stretch may be quoted: the next draft is k long
            self._probe = False
        else:
            self._run = run if self._run is None else RUN_DECAY * self._run + (1 - RUN_DECAY) * run
        self._recent.extend([True] * num_accepted + [False] * (num_drafted - num_accepted))
        self._reached[0] += num_accepted
        self._reached[1] += num_accepted < num_drafted
        if self._probation and num_accepted < min_acceptance * num_drafted:
            self._pause_drafting()
            return
        if len(self._recent) < MIN_JUDGED:
            return  # too few to judge the window
        if sum(self._recent) / len(self._recent) < min_acceptance:
            self._pause_drafting()
        else:
            self._probation, self._next_pause = False, PAUSE_STEPS

    def _pause_drafting(self) -> None:
        self._pause = self._next_pause
        self._next_pause = min(2 * self._next_pause, MAX_PAUSE_STEPS)
        self._recent.clear()
        self._reached = [0, 0]
        self._probation, self._run, self._probe = True, None, True


class EngineAcceptance:
    """The chance that a reached draft token is accepted, over the engine's recent drafts (counts decayed by
    ENGINE_DECAY a draft, one accepted and one rejected token of prior): what a sequence with little history
    of its own is assumed to get. Where the workload quotes its prompts, new sequences' drafts grow long at
    once; where it tells stories, they stay short."""

    def __init__(self):
        self._accepted = self._rejected = 0.0

    def record(self, num_drafted: int, num_accepted: int) -> None:
        self._accepted = ENGINE_DECAY * self._accepted + num_accepted
        self._rejected = ENGINE_DECAY * self._rejected + (num_accepted < num_drafted)

    def chance(self) -> float:
        return (self._accepted + 1) / (self._accepted + self._rejected + 2)


class SpecCounters:
    """Cumulative since the worker started, as vLLM counts them: a draft is one (sequence, step) with at
    least one drafted token verified; accepted excludes the bonus token; per_position[i] counts drafts
    whose token i was accepted; histogram[a] counts drafts that accepted exactly a tokens."""

    def __init__(self, k: int):
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.accepted_per_position = [0] * k
        self.acceptance_histogram = [0] * (k + 1)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1
        self.acceptance_histogram[num_accepted] += 1

    def wire_fields(self) -> dict:
        """These counts under shared/wire.py:WorkerStats' field names."""
        return dict(spec_num_drafts=self.num_drafts, spec_num_draft_tokens=self.num_draft_tokens,
                    spec_num_accepted_tokens=self.num_accepted_tokens,
                    spec_accepted_per_position=list(self.accepted_per_position),
                    spec_acceptance_histogram=list(self.acceptance_histogram))
