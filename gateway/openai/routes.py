"""POST /v1/completions and POST /v1/chat/completions, streaming and not.

Every check that can fail (body, parameters, model, context length, capacity) runs before a request
is submitted, so errors are plain HTTP responses, never a broken stream. Once streaming, a worker that
dies or refuses the request ends the stream with an error event.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.openai.parse import (ChatRequest, CommonFields, CompletionRequest, parse_chat, parse_completion,
                                  require_model)
from gateway.openai.response_bodies import ChatFormat, CompletionFormat
from gateway.server.auth import ApiKey, caller
from gateway.server.client_io import collect_unless_disconnected, one_line_json, read_json
from gateway.server.deadlines import check_not_passed, request_deadline
from gateway.server.errors import ApiError, ContextLengthExceeded, invalid
from gateway.server.key_limits import Lease
from gateway.server.task_guard import require_task
from gateway.streams.choice_stream import ChoiceEvent, GenerationStream, TextOptions, Usage, merge
from gateway.streams.resume_buffer import NamedEvent, Payload
from gateway.streams.resume_routes import start_response as resumable_response
from gateway.text.bad_words import bad_words_token_ids
from gateway.text.grammars import build_grammar, free_text_rules, response_format_rules
from gateway.text.output_constraints import constraint_rules
from gateway.text.prompt_logprobs import PromptLogprob, echo_logprobs, join_logprobs, vllm_prompt_logprobs
from gateway.text.tool_call_parser import assemble
from gateway.text.tool_specs import tool_grammar_rules
from gateway.workers.pool import NoWorkerAvailable
from shared.request_limits import ContextOverflow, OutOfBounds, check_prompt_fits
from shared.wire import WorkerReady
from shared.sampling_params import SamplingParams, SamplingParamsError

log = logging.getLogger("mili.gateway")


@dataclass
class Admitted:
    """A validated request, submitted to a worker."""

    streams: list[GenerationStream]
    n: int
    lease: Lease  # its place in its API key's count of requests in flight

    @property
    def usage(self) -> Usage:
        total = Usage()
        for s in self.streams:
            total.prompt_tokens += s.usage.prompt_tokens
            total.completion_tokens += s.usage.completion_tokens
            total.cached_tokens += s.usage.cached_tokens
        return total

    def events(self) -> AsyncIterator[ChoiceEvent]:
        return merge(self.streams, self.n)

    def abort(self) -> None:
        """Drop the request in its worker unless it already finished, and end its count against its API
        key (idempotent; called however the response ends)."""
        for s in self.streams:
            s.pool.abort(s.handle)
        self.lease.release()


async def completions(request: Request) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")  # before the body: its shape is another task's
    deadline = request_deadline(request, state.settings.request_timeout)
    req = parse_completion(await read_json(request, state.settings.max_body_bytes), state.settings.limits)
    admitted, prompts = await admit_completion(request, req, deadline)
    fmt = CompletionFormat(req.model, state.token_names)
    echo = [state.text.decode(p) if req.echo else "" for p in prompts]
    if req.stream:
        return sse_response(request, _completion_chunks(fmt, req, admitted, prompts, echo), admitted)
    events = await collect(request, admitted)
    n = req.params.n
    texts, logprobs, reasons = _gather(events, len(prompts) * n)
    scores = _prompt_scores(events, n)
    generated = _token_ids(events, len(texts))
    choices = []
    for i, text in enumerate(texts):
        p = i // n
        lp = None
        if req.params.logprobs is not None:
            lp = fmt.logprobs(logprobs[i], len(echo[p]))
            if req.echo:
                lp = join_logprobs(echo_logprobs(fmt.names, prompts[p], scores[p], req.params.logprobs), lp)
        choice = fmt.choice(i, echo[p] + text, lp, reasons[i])
        if req.prompt_logprobs is not None:  # vLLM's extension, per choice
            choice["prompt_logprobs"] = vllm_prompt_logprobs(fmt.names, scores[p], req.prompt_logprobs)
        if req.return_token_ids:  # vLLM's too
            choice["prompt_token_ids"], choice["token_ids"] = prompts[p], generated[i]
        choices.append(choice)
    return JSONResponse(fmt.body(choices, admitted.usage))


async def chat_completions(request: Request) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")
    deadline = request_deadline(request, state.settings.request_timeout)
    req = parse_chat(await read_json(request, state.settings.max_body_bytes), state.settings.limits)
    admitted, options = await admit_chat(request, req, deadline)
    fmt = ChatFormat(req.model, state.token_names)
    if req.stream:
        return sse_response(request, _chat_chunks(fmt, req, admitted), admitted)
    events = await collect(request, admitted)
    texts, logprobs, reasons = _gather(events, req.params.n)
    reasoning = [""] * req.params.n
    call_pieces: list[list] = [[] for _ in range(req.params.n)]
    for e in events:
        reasoning[e.index] += e.reasoning
        call_pieces[e.index] += e.tool_calls
    choices = []
    generated = _token_ids(events, req.params.n)
    for i in range(req.params.n):
        tool_calls = assemble(call_pieces[i])
        reason = req.tools.finish_reason(bool(tool_calls), reasons[i]) if req.tools else reasons[i]
        choices.append(fmt.message_choice(i, texts[i], reasoning[i] if options.split_reasoning else None,
                                          fmt.logprobs(logprobs[i]) if req.top_logprobs is not None else None,
                                          reason, tool_calls))
        if req.return_token_ids:  # vLLM's extension: the choice's tokens, the prompt's once for the response
            choices[-1]["token_ids"] = generated[i]
    body = fmt.body(choices, admitted.usage)
    if req.return_token_ids:
        body["prompt_token_ids"] = admitted.streams[0].prompt
    if req.prompt_logprobs is not None:  # vLLM's extension, once for the response
        body["prompt_logprobs"] = vllm_prompt_logprobs(fmt.names, _prompt_scores(events, req.params.n)[0],
                                                       req.prompt_logprobs)
    return JSONResponse(body)


async def admit_chat(request: Request, req: ChatRequest, deadline: float | None) -> tuple[Admitted, TextOptions]:
    """A parsed chat request rendered, constrained and submitted (also what /v1/responses runs)."""
    state = request.app.state.mili
    _check_served(state, req)
    rendered, prompt = state.text.render_chat(list(req.messages), req.template_kwargs, req.tools,
                                              req.add_generation_prompt, req.continue_final_message)
    [prompt] = _truncated(state, req, [prompt])
    params = _with_bad_words(state, req, await _constrained(state, req, state.text.reasoning_mode(rendered)))
    calls = req.tools is not None and req.tools.calls_possible
    options = TextOptions(stop=req.stop, split_reasoning=state.text.split_reasoning,
                          starts_in_reasoning=state.text.starts_in_reasoning(rendered), parse_tool_calls=calls,
                          tool_calls_only=calls and req.tools.calls_only, skip_special_tokens=req.skip_special_tokens,
                          include_stop=req.include_stop)
    return _admit(state, req, [prompt], options, caller(request), deadline, params), options


async def admit_completion(request: Request, req: CompletionRequest,
                           deadline: float | None) -> tuple[Admitted, list[list[int]]]:
    """A parsed completion request tokenized, constrained and submitted (also what Ollama's raw /api/generate
    runs); returns its prompts' token ids too."""
    state = request.app.state.mili
    _check_served(state, req)
    prompts = _truncated(state, req, [state.text.encode_prompt(p, req.suffix) for p in req.prompts])
    params = _with_bad_words(state, req, await _constrained(state, req, "none"))  # no reasoning split off
    options = TextOptions(stop=req.stop, skip_special_tokens=req.skip_special_tokens, include_stop=req.include_stop)
    return _admit(state, req, prompts, options, caller(request), deadline, params), prompts


def _truncated(state, req: CommonFields, prompts: list[list[int]]) -> list[list[int]]:
    """vLLM's truncate_prompt_tokens: each prompt's last N tokens (the conversation's end is what a reply needs)."""
    keep = req.truncate_prompt_tokens
    if keep is None:
        return prompts
    context = ready_info(state).max_model_len
    if keep > context:
        raise invalid(f"truncate_prompt_tokens ({keep}) exceeds this model's context length ({context} tokens)",
                      "truncate_prompt_tokens")
    keep = context if keep == -1 else keep
    return [p[len(p) - keep:] if len(p) > keep else p for p in prompts]


def _with_bad_words(state, req: CommonFields, params: SamplingParams) -> SamplingParams:
    if not req.bad_words:
        return params
    return dataclasses.replace(params, bad_words_token_ids=bad_words_token_ids(state.text.tokenizer, req.bad_words))


async def _constrained(state, req: ChatRequest | CompletionRequest, reasoning: str) -> SamplingParams:
    """The request's sampling parameters with the grammar its tools, response_format, other constraint or
    thinking budget call for (compiled and checked here, so a bad schema or grammar is a 400 before anything
    runs). `reasoning`: where the output's reasoning stands (grammars.build_grammar)."""
    tools, response_format = getattr(req, "tools", None), getattr(req, "response_format", None)
    budget = getattr(req, "thinking_budget", None) if reasoning != "none" else None
    if tools is not None and tools.calls_possible:
        param = "tools"
    elif response_format is not None:
        param = "response_format"
    elif req.constraint is not None:
        param = req.constraint.param
    elif budget is not None:
        param = "thinking"
    else:
        return req.params
    try:
        grammars: dict[str, str] = {}
        if param == "tools":
            rules = tool_grammar_rules(tools, response_format, state.text.tool_tags_are_tokens())
        elif param == "response_format":
            rules = response_format_rules(response_format)
        elif param == "thinking":
            rules = free_text_rules()
        else:
            rules, grammars = constraint_rules(req.constraint)
        grammar = build_grammar(rules, reasoning, grammars, budget)
    except UnicodeEncodeError:  # JSON's "\ud800" escapes decode to text that llguidance (UTF-8) cannot take
        raise invalid(f"{param} holds a lone surrogate (\\ud800-\\udfff), which no output can match", param) from None
    try:  # SamplingParams bounds the grammar's size (request_limits.MAX_GRAMMAR_CHARS): many large tools pass it
        constrained = dataclasses.replace(req.params, grammar=grammar)
    except SamplingParamsError as e:
        raise invalid(f"{param}: {e}", param) from None
    await state.text.grammars.check(grammar, param)
    return constrained


# ----- admission -----
def _check_served(state, req: CommonFields) -> None:
    require_task(state.engine_config.task, "generate")
    require_model(req.model, state.settings.served_model_names)
    if state.draining:
        raise ApiError(503, "the server is shutting down", code="draining")


def ready_info(state) -> WorkerReady:
    """What the ready workers serve (vocabulary, context); a 503 while none is ready."""
    info = state.pool.info
    if info is None:
        raise ApiError(503, "no worker is ready: " + ("; ".join(state.pool.down_reasons()) or "starting"),
                       code="worker_unavailable", headers={"Retry-After": "5"})
    return info


def take_place(state, prompts: list[list[int]], key: ApiKey, deadline: float | None) -> tuple[Lease, float]:
    """Room in the queue for the prompts, a deadline not yet passed, and a place under the key's max_concurrent
    (429 when it is full): the lease that holds it, and the request's arrival time."""
    if state.pool.num_in_flight() + len(prompts) > state.capacity:
        raise ApiError(503, "the server's request queue is full; retry later", code="queue_full",
                       headers={"Retry-After": "1"})
    try:
        check_not_passed(deadline)  # reading and tokenizing the request count against it too
    except ApiError:
        state.metrics.finished("deadline", sum(map(len, prompts)))
        raise
    arrival = time.monotonic()
    return state.key_limits.acquire(key, arrival), arrival


def _admit(state, req: CommonFields, prompts: list[list[int]], options: TextOptions, key: ApiKey,
           deadline: float | None = None, params: SamplingParams | None = None) -> Admitted:
    params = params or req.params
    info = ready_info(state)
    _check_tokens(params, prompts, info.vocab_size, info.max_model_len)
    lease, arrival = take_place(state, prompts, key, deadline)
    streams: list[GenerationStream] = []
    try:
        for prompt in prompts:
            streams.append(GenerationStream(state.pool, state.metrics, state.text.tokenizer, prompt, params,
                                            options, arrival, deadline, key.name, key.weight))
    except NoWorkerAvailable as e:
        for s in streams:
            state.pool.abort(s.handle)
        lease.release()
        raise ApiError(503, f"no worker is ready: {e}", code="worker_unavailable") from None
    return Admitted(streams, params.n, lease)


def check_would_fit(state, params: SamplingParams) -> None:
    """Admission's checks of a request's own numbers, for a request that will not run (Ollama's load): its token
    ids are in the vocabulary, and its max_tokens leaves the context room for the shortest prompt, one token."""
    info = ready_info(state)
    _check_tokens(params, [[0]], info.vocab_size, info.max_model_len)


def _check_tokens(params: SamplingParams, prompts: list[list[int]], vocab: int, context: int) -> None:
    try:
        params.check_token_ids(vocab)
    except SamplingParamsError as e:
        raise invalid(str(e), e.param) from None
    for prompt in prompts:
        if not prompt:
            raise invalid("the prompt is empty after tokenization", "prompt")
        try:
            check_prompt_fits(prompt, params.max_tokens, vocab, context)
        except ContextOverflow as e:
            raise ContextLengthExceeded(e) from None
        except OutOfBounds as e:
            raise invalid(str(e), e.param) from None


# ----- non-streaming -----
async def collect(request: Request, admitted: Admitted) -> list[ChoiceEvent]:
    try:
        return await collect_unless_disconnected(request, admitted.events())
    finally:
        admitted.abort()


def _gather(events: list[ChoiceEvent], num_choices: int):
    texts = [""] * num_choices
    logprobs: list[list] = [[] for _ in range(num_choices)]
    reasons: list[str | None] = [None] * num_choices
    for e in events:
        texts[e.index] += e.text
        logprobs[e.index].extend(e.logprobs)
        reasons[e.index] = e.finish_reason or reasons[e.index]
    return texts, logprobs, reasons


def _token_ids(events: list[ChoiceEvent], num_choices: int) -> list[list[int]]:
    generated: list[list[int]] = [[] for _ in range(num_choices)]
    for e in events:
        generated[e.index].extend(e.token_ids)
    return generated


def _prompt_scores(events: list[ChoiceEvent], choices_per_prompt: int) -> dict[int, list[PromptLogprob]]:
    """Prompt index -> its prompt logprobs (entry i: prompt token i + 1), for requests that asked."""
    return {e.index // choices_per_prompt: e.prompt_logprobs for e in events if e.prompt_logprobs is not None}


# ----- streaming -----
def sse_response(request: Request, chunks: AsyncIterator[Payload], admitted: Admitted,
                 named: bool = False, ping: NamedEvent | None = None) -> EventSourceResponse:
    """A stream's response; its payloads are data strings, or with `named` NamedEvents (each sent with an SSE
    event name). Keep-alives are SSE comments, or `ping` events where the API has its own (not on a resumable
    stream, whose keep-alives must stay comments)."""
    state = request.app.state.mili
    if state.streams is not None:  # --stream-resume-ttl: the generation outlives this connection
        return resumable_response(state.streams, _ending_lease(chunks, admitted), admitted.abort, request,
                                  state.settings.sse_ping_s)
    # The stream's own cleanup aborts the request when the client leaves mid-stream; the background task
    # also covers a client gone before the stream's first iteration (a generator never started has no
    # cleanup to run). It runs once the response ends, however it ends.
    ping_factory = None if ping is None else lambda: ServerSentEvent(data=ping.data, event=ping.event, sep="\n")
    return EventSourceResponse(_as_events(chunks) if named else chunks, ping=state.settings.sse_ping_s, sep="\n",
                               ping_message_factory=ping_factory, background=BackgroundTask(admitted.abort))


async def _as_events(chunks: AsyncIterator[NamedEvent]) -> AsyncIterator[ServerSentEvent]:
    try:
        async for chunk in chunks:
            yield ServerSentEvent(data=chunk.data, event=chunk.event, sep="\n")
    finally:
        await chunks.aclose()  # the request's own cleanup now, not when the generator is collected


async def _ending_lease(chunks: AsyncIterator[Payload], admitted: Admitted) -> AsyncIterator[Payload]:
    """A resumable stream's payloads: however they end (a resumable stream that ends on its own is not
    aborted), the request's count against its API key ends with them."""
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        try:
            await chunks.aclose()  # the request's own cleanup now, not when the generator is collected
        finally:
            admitted.lease.release()


async def _with_error_event(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            yield one_line_json(chunk)
    except ApiError as e:
        log.warning("stream ended with an error: %s", e.message)
        yield json.dumps(e.body())
    yield "[DONE]"


def _usage_so_far(req, admitted: Admitted) -> Callable[[], Usage | None]:
    """A chunk's usage: with vLLM's continuous_usage_stats the tokens so far, else none (only the last chunk's)."""
    return (lambda: admitted.usage) if req.continuous_usage else (lambda: None)


def _completion_chunks(fmt: CompletionFormat, req, admitted: Admitted, prompts: list[list[int]],
                       echo: list[str]) -> AsyncIterator[str]:
    so_far = _usage_so_far(req, admitted)

    prompt_pending = [True] * (len(prompts) * req.params.n)

    def choice(index: int, text: str, lp: dict | None, finish_reason: str | None, token_ids=()) -> dict:
        """A chunk's choice; with vLLM's return_token_ids, its tokens, and the prompt's on the choice's first."""
        out = fmt.choice(index, text, lp, finish_reason)
        if req.return_token_ids:
            if prompt_pending[index]:
                out["prompt_token_ids"], prompt_pending[index] = prompts[index // req.params.n], False
            out["token_ids"] = list(token_ids)
        return out

    async def chunks() -> AsyncIterator[dict]:
        n = req.params.n
        offsets = [len(echo[i // n]) for i in range(len(echo) * n)]
        # With logprobs, a prompt's echo waits for its scores, which come before any of its tokens.
        scored_echo = req.echo and req.params.logprobs is not None
        if req.echo and not scored_echo:
            for i in range(len(offsets)):
                yield fmt.body([choice(i, echo[i // n], None, None)], so_far(), req.include_usage)
        async for e in admitted.events():
            if scored_echo and e.prompt_logprobs is not None:
                p = e.index // n
                lp = echo_logprobs(fmt.names, prompts[p], e.prompt_logprobs, req.params.logprobs)
                for i in range(p * n, (p + 1) * n):
                    yield fmt.body([choice(i, echo[p], lp, None)], so_far(), req.include_usage)
            lp = None
            if req.params.logprobs is not None and e.logprobs:
                lp = fmt.logprobs(e.logprobs, offsets[e.index])
                # Offsets advance by the tokens' own texts, as in the non-streamed response: the text a
                # chunk carries can differ while the detokenizer holds back part of a character.
                offsets[e.index] = lp["text_offset"][-1] + len(lp["tokens"][-1])
            if e.text or lp or e.finish_reason or (req.return_token_ids and e.token_ids):
                yield fmt.body([choice(e.index, e.text, lp, e.finish_reason, e.token_ids)], so_far(),
                               req.include_usage)
        if req.include_usage:
            yield fmt.body([], admitted.usage)

    return _with_error_event(chunks())


def _chat_chunks(fmt: ChatFormat, req, admitted: Admitted) -> AsyncIterator[str]:
    so_far = _usage_so_far(req, admitted)

    async def chunks() -> AsyncIterator[dict]:
        tools = req.tools if req.tools is not None and req.tools.calls_possible else None
        # The role first, before any token: clients see the stream is live. With tools the content may
        # never come (only calls), so it starts as null, as OpenAI's does.
        for i in range(req.params.n):
            first = fmt.body([{"index": i, "delta": {"role": "assistant", "content": None if tools else ""},
                               "logprobs": None, "finish_reason": None}], so_far(), chunk=True,
                             include_usage_field=req.include_usage)
            if req.return_token_ids:  # vLLM's extension: the prompt's tokens on each choice's first chunk
                first["prompt_token_ids"] = admitted.streams[0].prompt
            yield first
        with_logprobs = req.top_logprobs is not None
        made_calls = [False] * req.params.n
        async for e in admitted.events():
            if tools is not None:
                made_calls[e.index] = made_calls[e.index] or bool(e.tool_calls)
                e.finish_reason = tools.finish_reason(made_calls[e.index], e.finish_reason)
            if (e.text or e.reasoning or e.tool_calls or e.finish_reason or (with_logprobs and e.logprobs)
                    or (req.return_token_ids and e.token_ids)):
                choices = fmt.delta_choices(e, with_logprobs)
                if req.return_token_ids:
                    choices[-1]["token_ids"] = e.token_ids
                for choice in choices:
                    yield fmt.body([choice], so_far(), chunk=True, include_usage_field=req.include_usage)
        if req.include_usage:
            yield fmt.body([], admitted.usage, chunk=True)

    return _with_error_event(chunks())
