"""One request's token deltas turned into text events: detokenization, stop strings, reasoning split,
logprobs, timings. Streaming and non-streaming responses both consume `run`.

Leaving `run` early (a client disconnect cancels the consuming task, or every choice hit a stop
string) aborts the request in its worker, so its KV blocks are freed within one engine step. A choice of
several that hits a stop string is aborted alone, and the others run on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tokenizers import Tokenizer

from gateway.metrics.mili_metrics import Metrics
from gateway.server.deadlines import DeadlineExceeded, exceeded
from gateway.server.errors import ApiError
from gateway.text.detokenizer import IncrementalDetokenizer
from gateway.text.prompt_logprobs import PromptLogprob, from_wire
from gateway.text.reasoning import ReasoningSplitter
from gateway.text.stop_strings import StopStringMatcher
from gateway.text.tool_call_parser import ToolCallDelta, ToolCallParser
from gateway.workers.link import RequestHandle, WorkerLost
from gateway.workers.pool import WorkerPool
from shared import wire
from shared.sampling_params import SamplingParams


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class ChoiceEvent:
    """New output of one choice. `text` is final (never retracted); `reasoning` is the part of the
    output inside <think>...</think> when the request splits reasoning."""

    index: int
    text: str = ""
    reasoning: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    # The prompt's scores when asked for: once per prompt, on one choice's first event (entry i: token i + 1).
    prompt_logprobs: list[PromptLogprob] | None = None
    tool_calls: list[ToolCallDelta] = field(default_factory=list)  # pieces of calls parsed out of the content
    stop_string: str | None = None  # the stop string that ended the choice, if one did
    # The last of `logprobs` is the stop token that ended the choice: the chat and completions APIs list it (as
    # vLLM does), the Responses API's text logprobs do not. A delta may carry text tokens before it.
    ends_on_stop_token: bool = False
    # The generated tokens this event accounts for: those up to a stop string's last, or a stop token not written.
    token_ids: list[int] = field(default_factory=list)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True)
class TextOptions:
    stop: tuple[str, ...] = ()
    split_reasoning: bool = False
    starts_in_reasoning: bool = False
    skip_special_tokens: bool = True
    include_stop: bool = False  # the text keeps the stop string that ended it (vLLM's include_stop_str_in_output)
    parse_tool_calls: bool = False  # the content's <tool_call> blocks become tool_calls (the grammar made them)
    tool_calls_only: bool = False  # the grammar allows calls and no text (tool_specs.ToolSpec.calls_only)


class _Choice:
    def __init__(self, index: int, tokenizer: Tokenizer, prompt: list[int], options: TextOptions):
        self.index = index
        self.detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=options.skip_special_tokens)
        self.stops = StopStringMatcher(list(options.stop), options.include_stop) if options.stop else None
        self.reasoning = ReasoningSplitter(options.starts_in_reasoning) if options.split_reasoning else None
        self.tool_calls = ToolCallParser(options.tool_calls_only) if options.parse_tool_calls else None
        self.num_tokens = 0
        self.finished = False
        self.last_token_time: float | None = None

    def advance(self, delta: wire.TokenDelta) -> ChoiceEvent:
        finish = delta.finish_reason
        token_ids, unwritten = delta.token_ids, 0
        if delta.stop_token_id in self.detok.special_ids and token_ids and token_ids[-1] == delta.stop_token_id:
            # A special stop token (an EOS) ends the answer and is not part of its text, even where special tokens
            # are written (skip_special_tokens false); it is still one of the tokens generated.
            token_ids, unwritten = token_ids[:-1], 1
        text, hit, taken = self._text(token_ids, finish is not None)
        if hit:
            finish = "stop"
        else:
            taken += unwritten
        self.num_tokens += taken
        event = ChoiceEvent(self.index, logprobs=[TokenLogprob(t, lp, [(a, b) for a, b in top])
                                                  for t, lp, top in (delta.logprobs or ())[:taken]],
                            stop_string=self.stops.matched if hit and self.stops is not None else None,
                            ends_on_stop_token=delta.stop_token_id is not None and not hit and taken > 0,
                            token_ids=delta.token_ids[:taken])  # a slice: already a copy
        if self.reasoning is not None:
            event.reasoning, text = self.reasoning.feed(text)
            if finish is not None:
                tail_reasoning, tail_text = self.reasoning.flush()
                event.reasoning += tail_reasoning
                text += tail_text
        if self.tool_calls is not None:
            text, event.tool_calls = self.tool_calls.feed(text)
            if finish is not None:
                tail_text, tail_calls = self.tool_calls.flush()
                text += tail_text
                event.tool_calls += tail_calls
        event.text = text
        if delta.prompt_logprobs is not None:
            event.prompt_logprobs = from_wire(delta.prompt_logprobs)
        if finish is not None:
            self.finished = True
            event.finish_reason = "stop" if finish == "abort" else finish
        return event

    def _text(self, token_ids: list[int], final: bool) -> tuple[str, bool, int]:
        """The text of `token_ids` (a final delta: with what the detokenizer held back), cut where a stop
        string ends: (text, whether a stop string ended it, tokens taken). A delta may carry several steps'
        tokens (gateway/workers/output_queue.py); with stop strings they go through one at a time, so the choice
        counts exactly the tokens up to the one that completed the stop string."""
        if self.stops is None:
            text = self.detok.push(token_ids)
            return (text + self.detok.flush() if final else text), False, len(token_ids)
        text = ""
        for taken in range(1, len(token_ids) + 1):
            kept, hit = self.stops.feed(self.detok.push(token_ids[taken - 1:taken]))
            text += kept
            if hit:
                return text, True, taken
        if final:
            kept, hit = self.stops.feed(self.detok.flush())
            text += kept if hit else kept + self.stops.flush()
            return text, hit, len(token_ids)
        return text, False, len(token_ids)


class GenerationStream:
    """Submits one prompt and yields its ChoiceEvents; `usage` is complete once the iteration ends."""

    def __init__(self, pool: WorkerPool, metrics: Metrics, tokenizer: Tokenizer, prompt: list[int],
                 params: SamplingParams, options: TextOptions, arrival: float, deadline: float | None = None,
                 tenant: str = "", tenant_weight: float = 1.0):
        self.pool = pool
        self.metrics = metrics
        self.arrival = arrival
        self.handle: RequestHandle = pool.submit(prompt, params, deadline, tenant, tenant_weight)
        self.prompt = prompt
        self.choices = [_Choice(i, tokenizer, prompt, options) for i in range(params.n)]
        self.usage = Usage(prompt_tokens=len(prompt))
        self.finish_reasons: list[str | None] = [None] * params.n
        self.first_token_time: float | None = None  # time.monotonic() when the first token arrived

    async def events(self) -> AsyncIterator[ChoiceEvent]:
        first_token_seen = False
        queue_time_seen = False
        try:
            while not all(c.finished for c in self.choices):
                item = await self.handle.queue.get()
                if isinstance(item, WorkerLost):
                    raise ApiError(503, item.message, code="worker_lost")
                if isinstance(item, wire.RequestFailed):
                    raise ApiError(400, item.message, item.param)
                if isinstance(item, DeadlineExceeded) or item.finish_reason == "deadline":
                    self.finish_reasons[0] = "deadline"  # the request's count goes under "deadline"
                    raise exceeded()
                choice = self.choices[item.index]
                if choice.finished:
                    continue  # this choice already stopped on a stop string
                now = time.monotonic()
                if item.queue_time is not None and not queue_time_seen:
                    queue_time_seen = True
                    self.metrics.queue_time.labels(*self.metrics.labels).observe(item.queue_time)
                self.usage.cached_tokens = item.num_cached_tokens
                if item.token_ids:
                    if not first_token_seen:
                        first_token_seen = True
                        self.first_token_time = now
                        self.metrics.ttft.labels(self.metrics.model).observe(now - self.arrival)
                    elif choice.last_token_time is not None:
                        # One observation per delta: a delta that merged steps the stream fell behind on
                        # reaches the client as one event, and this is the gap the client saw before it.
                        self.metrics.itl.labels(self.metrics.model).observe(now - choice.last_token_time)
                    choice.last_token_time = now
                tokens_before = choice.num_tokens
                event = choice.advance(item)
                if choice.num_tokens > tokens_before:  # a stop string may leave a merged delta's tail unread
                    self.metrics.generation_tokens.labels(self.metrics.model).inc(choice.num_tokens - tokens_before)
                    self.usage.completion_tokens += choice.num_tokens - tokens_before  # live: usage so far
                if event.finish_reason is not None:
                    self.finish_reasons[choice.index] = event.finish_reason
                    if item.finish_reason is None and not all(c.finished for c in self.choices):
                        # A stop string ended this choice; free its blocks now, not when the last one ends.
                        self.pool.abort_choice(self.handle, choice.index)
                yield event
            self.metrics.e2e.labels(*self.metrics.labels).observe(time.monotonic() - self.arrival)
        finally:
            self.usage.completion_tokens = sum(c.num_tokens for c in self.choices)
            if self.handle.queue.merges:
                self.metrics.stream_merged_deltas.labels(self.metrics.model).inc(self.handle.queue.merges)
            # One count per request, under its first choice's reason ("abort" when it never finished).
            self.metrics.finished(self.finish_reasons[0] or "abort", self.usage.prompt_tokens)
            # A no-op when the worker already finished every choice; otherwise (disconnect, stop string,
            # error) the worker drops the request and frees its blocks.
            self.pool.abort(self.handle)


async def merge(streams: list[GenerationStream], choices_per_stream: int) -> AsyncIterator[ChoiceEvent]:
    """Several prompts' events as one stream, choice indices renumbered prompt-major (as OpenAI does)."""
    if len(streams) == 1:
        async for event in streams[0].events():
            yield event
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: GenerationStream) -> None:
        try:
            async for event in stream.events():
                event.index += i * choices_per_stream
                await queue.put(event)
        except BaseException as e:  # handed to the consumer, which re-raises
            await queue.put(e)
        finally:
            await queue.put(done)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
