"""llama.cpp server's own API, for the clients written against it (editor plugins and front-ends that post to
llama-server's native routes, `curl` scripts): POST /completion (also spelled /completions, as llama-server
takes it), POST /infill (code at an editor's cursor, gateway/llamacpp/infill.py), POST /apply-template (a
conversation rendered by the chat template, not run) and GET /props. /tokenize and /detokenize take llama.cpp's
bodies beside vLLM's (gateway/openai/tokenize_routes.py).

A /completion request runs as the completion it translates into (gateway/llamacpp/to_completion.py) and is answered
in llama.cpp's shape (gateway/llamacpp/completion_output.py); streamed, as `data: {...}` server-sent events, the
last with `stop: true`, and no `[DONE]`, as llama-server ends its own. Errors are the OpenAI-shaped error object
llama-server answers with as well; once a stream has started, a failure is one last `data: {"error": ...}` event.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.llamacpp.completion_output import LlamaOutput, LlamaRequestView, Times
from gateway.llamacpp.completion_schema import LlamaCompletionBody, LlamaInfillBody
from gateway.llamacpp.infill import infill_ids
from gateway.llamacpp.to_completion import completion_body, llama_names
from gateway.openai.parse import parse_completion
from gateway.openai.routes import Admitted, admit_completion, ready_info, sse_response
from gateway.openai.tokenize_routes import rendered_chat
from gateway.openai.tokenize_schema import TokenizeChatBody
from gateway.openai.validation import validate
from gateway.server.client_io import collect_unless_disconnected, one_line_json, read_json
from gateway.server.deadlines import request_deadline
from gateway.server.errors import ApiError
from gateway.server.task_guard import require_task
from gateway.text.fill_in_middle import SPELLINGS

log = logging.getLogger("mili.gateway")

# The translated request's fields that generation_settings reports, under llama.cpp's names.
_SETTINGS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
             "max_tokens": "n_predict", "stop": "stop", "repetition_penalty": "repeat_penalty",
             "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
             "ignore_eos": "ignore_eos", "logprobs": "n_probs", "grammar": "grammar"}


async def completion(request: Request) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")
    body = validate(LlamaCompletionBody, await read_json(request, state.settings.max_body_bytes), ())
    return await _answer(request, body, _translated(request, body))


async def infill(request: Request) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")
    body = validate(LlamaInfillBody, await read_json(request, state.settings.max_body_bytes), ())
    fim = state.text.fim
    if fim is None:
        raise ApiError(501, "Infill is not supported by this model: its tokenizer has none of the fill-in-the-middle "
                            "tokens (" + ", ".join(SPELLINGS[0]) + ")")
    translated = _translated(request, body)
    translated["prompt"] = infill_ids(state.text.tokenizer, fim, body.input_prefix, body.input_suffix, body.prompt,
                                      [(chunk.filename, chunk.text) for chunk in body.input_extra],
                                      ready_info(state).max_model_len, body.n_predict)
    return await _answer(request, body, translated)


def _translated(request: Request, body: LlamaCompletionBody) -> dict:
    """The completion request `body` means."""
    state = request.app.state.mili
    tokenizer = state.text.tokenizer
    with llama_names():
        return completion_body(body, state.settings.served_model_name,
                               lambda text, add_special: tokenizer.encode(text, add_special_tokens=add_special).ids)


async def _answer(request: Request, body: LlamaCompletionBody, translated: dict) -> Response:
    """Runs the translated completion and answers it in llama.cpp's shape, whole or streamed."""
    state = request.app.state.mili
    deadline = request_deadline(request, state.settings.request_timeout)
    with llama_names():
        req = parse_completion(translated, state.settings.limits, default_max_tokens=None)  # n_predict -1
        admitted, prompts = await admit_completion(request, req, deadline)
    prompt_text = translated["prompt"] if isinstance(translated["prompt"], str) else state.text.decode(prompts[0])
    view = LlamaRequestView(model=state.settings.served_model_name, prompt_text=prompt_text,
                            settings=_settings(translated, ready_info(state).max_model_len), n_probs=body.n_probs,
                            return_tokens=body.return_tokens, n_indent=body.n_indent,
                            t_max_predict_ms=body.t_max_predict_ms, response_fields=tuple(body.response_fields))
    output = LlamaOutput(view, state.token_names)
    if body.stream:
        return sse_response(request, _events(output, admitted), admitted)
    try:
        await collect_unless_disconnected(request, _fed(output, admitted))
    finally:
        admitted.abort()
    return JSONResponse(output.whole(admitted.usage, _times(admitted)))


async def _fed(output: LlamaOutput, admitted: Admitted) -> AsyncIterator[None]:
    """Feeds the answer its choice events until they end, or until a code-completion stop ends the text."""
    async for e in admitted.events():
        output.feed(e, admitted.usage, admitted.streams[0].first_token_time)
        yield None
        if output.stopped:
            return


def _times(admitted: Admitted) -> Times:
    stream = admitted.streams[0]
    return Times(stream.arrival, stream.first_token_time, stream.choices[0].last_token_time)


def _settings(translated: dict, context: int) -> dict:
    settings = {"n_ctx": context, "n_predict": -1, "temperature": 0.0, "stream": translated["stream"]}
    settings.update({name: translated[key] for key, name in _SETTINGS.items() if key in translated})
    return settings


async def _events(output: LlamaOutput, admitted: Admitted) -> AsyncIterator[str]:
    try:
        async for e in admitted.events():
            event = output.feed(e, admitted.usage, admitted.streams[0].first_token_time)
            if event is not None:
                yield one_line_json(event)
            if output.stopped:
                break
        yield one_line_json(output.closing(admitted.usage, _times(admitted)))
    except ApiError as e:
        log.warning("stream ended with an error: %s", e.message)
        yield one_line_json(e.body())
    finally:
        admitted.abort()


async def apply_template(request: Request) -> Response:
    """llama-server's POST /apply-template: the conversation rendered by the served chat template, as a chat request
    with it would run, without running it, so that a client can edit the prompt (prefill the answer, say) and post it
    to /completion. Takes /tokenize's conversation fields; answers {prompt}."""
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")
    body = validate(TokenizeChatBody, await read_json(request, state.settings.max_body_bytes))
    prompt, _ = rendered_chat(state, body)
    return JSONResponse({"prompt": prompt})


async def props(request: Request) -> Response:
    """What llama-server's clients read before they post: the context length, the chat template, the slots."""
    state = request.app.state.mili
    info = state.pool.info
    context = info.max_model_len if info is not None else None
    template = state.text.template.source if state.engine_config.task == "generate" else None
    return JSONResponse({
        "default_generation_settings": {"n_ctx": context, "params": {"n_predict": -1, "temperature": 0.8,
                                                                      "top_k": 40, "top_p": 0.95, "min_p": 0.05}},
        "total_slots": state.engine_config.max_num_seqs * state.settings.num_workers,
        "model_alias": state.settings.served_model_name, "model_path": str(state.engine_config.model),
        "chat_template": template or "", "modalities": {"vision": False, "audio": False},
        "build_info": "MILI", "is_sleeping": False})
