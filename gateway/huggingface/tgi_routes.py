"""text-generation-inference's (TGI's) own API, for the clients written against it (huggingface_hub's
InferenceClient.text_generation, LangChain's and LlamaIndex's TGI classes, `curl` scripts): POST /generate, POST
/generate_stream, and POST / (either, as the body's `stream` says; not streamed, the answer is a one-element array,
as TGI's compatibility route gives it).

A request runs as the completion it translates into (gateway/huggingface/tgi_to_completion.py) and is answered in
TGI's shape (gateway/huggingface/tgi_output.py). Errors are TGI's `{"error", "error_type"}` (422 for a request it
cannot take); a failure once a stream has started is one last `data:{"error", "error_type"}` event. The stream
sends no `[DONE]`: TGI's clients end at the event that carries generated_text.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.huggingface.errors import TGI, error_body
from gateway.huggingface.tgi_output import TgiOutput, TgiRequestView, special_ids
from gateway.huggingface.tgi_schema import UNSERVED, TgiGenerateBody, TgiParameters
from gateway.huggingface.tgi_to_completion import (DEFAULT_MAX_NEW_TOKENS, completion_body, parameters_of, samples,
                                                   tgi_names)
from gateway.openai.parse import parse_completion
from gateway.openai.routes import Admitted, admit_completion, collect, ready_info, sse_response
from gateway.openai.validation import validate
from gateway.server.client_io import one_line_json, read_json
from gateway.server.deadlines import request_deadline
from gateway.server.errors import ApiError, invalid
from gateway.server.task_guard import require_task

log = logging.getLogger("mili.gateway")


async def generate(request: Request) -> Response:
    return await _serve(request, stream=False, compat=False)


async def generate_stream(request: Request) -> Response:
    return await _serve(request, stream=True, compat=False)


async def compat_generate(request: Request) -> Response:
    """POST / on a generating server: TGI's route that streams or not as the body's `stream` says. As TGI's, it
    answers a text-generation model's request with the prompt before the generated text unless return_full_text
    is false, and not streamed, in a one-element array (the shape of the Inference API it stands in for)."""
    return await _serve(request, stream=None, compat=True)


async def _serve(request: Request, stream: bool | None, compat: bool) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")
    raw = await read_json(request, state.settings.max_body_bytes)
    body = _checked(raw)
    stream = body.stream if stream is None else stream
    p = parameters_of(body)
    context = ready_info(state).max_model_len
    if p.truncate is not None and p.truncate >= context:  # as TGI's: the kept prompt leaves room for output
        raise invalid(f"parameters.truncate must be less than the context length ({context}), got {p.truncate}",
                      "parameters.truncate")
    deadline = request_deadline(request, state.settings.request_timeout)
    with tgi_names():
        translated = completion_body(body, state.settings.served_model_name, _max_tokens(state, body, p, context),
                                     stream)
        req = parse_completion(translated, state.settings.limits)
        admitted, prompts = await admit_completion(request, req, deadline)
    view = TgiRequestView(prompt_text=body.inputs, prompt_ids=prompts[0],
                          return_full_text=compat if p.return_full_text is None else p.return_full_text,
                          details=p.details, prefill_details=p.decoder_input_details,
                          top_n_tokens=p.top_n_tokens or 0,
                          seed=p.seed if samples(p) else None)
    output = TgiOutput(view, state.token_names, special_ids(state.text.tokenizer))
    if stream:
        return sse_response(request, _events(output, admitted), admitted)
    for e in await collect(request, admitted):
        output.feed(e, admitted.usage)
    whole = output.whole(admitted.usage)
    return JSONResponse([whole] if compat else whole)


def _checked(raw: dict) -> TgiGenerateBody:
    """The body. A problem inside `parameters` (whose keys validate() treats as the client's own, naming only the
    map) is named by checking the parameters on their own, so that the 422 names the field inside them."""
    try:
        return validate(TgiGenerateBody, raw, ())
    except ApiError as e:
        if e.param == "parameters" and isinstance(raw.get("parameters"), dict):
            try:
                validate(TgiParameters, raw["parameters"], UNSERVED, tagged={"grammar": lambda node: node.get("type")})
            except ApiError as inner:
                if inner.param is not None:
                    inner.message = inner.message.replace(inner.param, "parameters." + inner.param, 1)
                    inner.param = "parameters." + inner.param
                raise inner from None
        raise


def _max_tokens(state, body: TgiGenerateBody, p: TgiParameters, context: int) -> int:
    """max_new_tokens, or TGI's default: up to 1024, within what the context leaves after the prompt."""
    if p.max_new_tokens is not None:
        return p.max_new_tokens
    prompt_length = len(state.text.encode_prompt(body.inputs))
    if p.truncate is not None:
        prompt_length = min(prompt_length, p.truncate)
    return max(1, min(DEFAULT_MAX_NEW_TOKENS, context - prompt_length))


async def _events(output: TgiOutput, admitted: Admitted) -> AsyncIterator[str]:
    try:
        async for e in admitted.events():
            for event in output.feed(e, admitted.usage):
                yield one_line_json(event)
    except ApiError as e:
        log.warning("stream ended with an error: %s", e.message)
        yield one_line_json(error_body(e, TGI)[0])
    finally:
        admitted.abort()
