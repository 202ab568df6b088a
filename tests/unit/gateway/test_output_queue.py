"""gateway/workers/output_queue.py: a request's untaken token deltas merge per choice, never across a terminal item,
and a choice's text, logprobs and token count are the same whether its steps arrive one by one or merged."""

from __future__ import annotations

import asyncio
import random

import pytest

from gateway.server.deadlines import DeadlineExceeded
from gateway.streams.choice_stream import TextOptions, _Choice
from gateway.workers.link import WorkerLost
from gateway.workers.output_queue import RequestOutputQueue
from shared import wire
from tests.helpers.toy_tokenizers import default_tokenizer


def delta(index: int, token_ids: list[int], finish: str | None = None, cached: int = 0, **extra) -> wire.TokenDelta:
    return wire.TokenDelta(request_id="r", index=index, token_ids=token_ids, finish_reason=finish,
                           num_prompt_tokens=5, num_cached_tokens=cached, **extra)


def drain(queue: RequestOutputQueue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def test_a_choices_untaken_deltas_merge_into_one():
    q = RequestOutputQueue()
    q.put_nowait(delta(0, [7], logprobs=[[7, -0.1, []]], queue_time=0.25, prompt_logprobs=[[3, -1.0, 1, []]]))
    q.put_nowait(delta(0, [8, 9], cached=16, logprobs=[[8, -0.2, []], [9, -0.3, []]]))
    q.put_nowait(delta(0, [10], "length", cached=32, stop_token_id=None, logprobs=[[10, -0.4, []]]))
    [only] = drain(q)
    assert only.token_ids == [7, 8, 9, 10] and only.finish_reason == "length"
    assert [row[0] for row in only.logprobs] == [7, 8, 9, 10]
    assert only.queue_time == 0.25 and only.prompt_logprobs == [[3, -1.0, 1, []]]  # once per choice: the first's
    assert only.num_cached_tokens == 32  # running figures: the latest
    assert q.merges == 2


def test_choices_merge_apart_and_each_keeps_its_order():
    q = RequestOutputQueue()
    for step in range(3):
        for index in (0, 1):
            q.put_nowait(delta(index, [10 * index + step]))
    assert [(d.index, d.token_ids) for d in drain(q)] == [(0, [0, 1, 2]), (1, [10, 11, 12])]


def test_a_taken_delta_is_never_merged_into():
    q = RequestOutputQueue()
    q.put_nowait(delta(0, [1]))
    assert q.get_nowait().token_ids == [1]
    q.put_nowait(delta(0, [2]))
    q.put_nowait(delta(0, [3]))
    assert [d.token_ids for d in drain(q)] == [[2, 3]]
    q.put_nowait(delta(0, [4]))  # after a drain the positions still line up
    q.put_nowait(delta(0, [5], "stop"))
    assert [(d.token_ids, d.finish_reason) for d in drain(q)] == [([4, 5], "stop")]


def test_nothing_merges_onto_a_finished_choice():
    q = RequestOutputQueue()
    q.put_nowait(delta(0, [1], "stop"))
    q.put_nowait(delta(0, [2]))  # a worker's late word about it: the stream skips it
    assert [(d.token_ids, d.finish_reason) for d in drain(q)] == [([1], "stop"), ([2], None)]


@pytest.mark.parametrize("terminal", [wire.RequestFailed(request_id="r", message="bad", param=None),
                                      WorkerLost("gone"), DeadlineExceeded(), delta(0, [2], "deadline")])
def test_nothing_merges_across_a_terminal_item(terminal):
    """Tokens before a deadline's delta stream before its error: they must not ride on the delta the stream
    answers with an error."""
    q = RequestOutputQueue()
    q.put_nowait(delta(0, [1]))
    q.put_nowait(terminal)
    q.put_nowait(delta(0, [3]))
    items = drain(q)
    assert items[0].token_ids == [1] and items[1] is terminal and items[2].token_ids == [3] and q.merges == 0


def test_get_waits_for_the_next_item():
    async def scenario() -> None:
        q = RequestOutputQueue()
        waiting = asyncio.ensure_future(q.get())
        await asyncio.sleep(0)
        assert not waiting.done()
        q.put_nowait(delta(0, [4]))
        assert (await asyncio.wait_for(waiting, 1)).token_ids == [4]
        with pytest.raises(asyncio.QueueEmpty):
            q.get_nowait()

    asyncio.run(scenario())


def run_choice(deltas: list[wire.TokenDelta], options: TextOptions) -> tuple[str, list[int], int, str | None]:
    """A choice's whole text, logprob ids, tokens counted and finish, as the stream builds them."""
    choice = _Choice(0, default_tokenizer(), [1, 2, 3], options)
    text, logprob_ids, finish = "", [], None
    for d in deltas:
        if choice.finished:
            continue  # as GenerationStream does
        event = choice.advance(d)
        text += event.text
        logprob_ids += [lp.token_id for lp in event.logprobs]
        finish = event.finish_reason
    return text, logprob_ids, choice.num_tokens, finish


def test_merged_steps_read_exactly_as_single_ones(test_seed):
    """Random token ids (multi-byte characters split across tokens included), stop strings cut from the text
    they make, each delta sequence fed one step at a time and merged at random take points: the same text,
    logprobs, token count (up to the token that completed a stop string, not the merged delta's end) and
    finish."""
    rng = random.Random(test_seed)
    tokenizer = default_tokenizer()
    vocab = tokenizer.get_vocab_size()
    stops_hit = 0
    for _ in range(60):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(2, 40))]
        steps = [delta(0, [t], "length" if i == len(ids) - 1 else None, logprobs=[[t, -1.0, []]])
                 for i, t in enumerate(ids)]
        whole = tokenizer.decode(ids, skip_special_tokens=True)
        stop = ()
        if rng.random() < 0.7 and len(whole) > 3:
            start = rng.randrange(len(whole) - 2)
            stop = (whole[start:start + rng.randrange(1, 4)],)
        options = TextOptions(stop=stop)
        single = run_choice(steps, options)
        queue = RequestOutputQueue()
        merged_steps = []
        for step in steps:
            queue.put_nowait(step)
            if rng.random() < 0.3:
                merged_steps += drain(queue)
        merged_steps += drain(queue)
        assert len(merged_steps) < len(steps) or queue.merges == 0
        assert run_choice(merged_steps, options) == single, (ids, stop)
        stops_hit += single[3] == "stop"
    assert stops_hit >= 10  # the cut-at-a-stop path ran
