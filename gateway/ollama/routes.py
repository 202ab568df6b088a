"""Ollama's API, for the applications that speak it to a local server: POST /api/chat and /api/generate (streamed
as newline-delimited JSON unless `stream` is false), GET /api/tags, POST /api/show, GET /api/ps and GET /api/version.
POST /api/embed and /api/embeddings (--task embed) are served beside the other pooling routes (gateway/pooling/).
A chat or generate request runs as the chat (or raw: completion) request it translates into
(gateway/ollama/to_chat.py) and is answered in Ollama's shape (gateway/ollama/output.py).

The served model is listed under each served name with Ollama's default tag (`name:latest`), and either spelling is
accepted. Errors are Ollama's `{"error": message}` with the status code; once a stream has started, a failure is
one last `{"error": ...}` line (what Ollama's clients raise from). Model management (pull, push, create, copy,
delete) is not served: the model is chosen when the server starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.ollama.output import OllamaOutput
from gateway.ollama.schema import OllamaChatBody, OllamaGenerateBody, OllamaPullBody, OllamaShowBody
from gateway.ollama.to_chat import chat_body, generate_body, ollama_names
from gateway.openai.parse import (ChatRequest, CompletionRequest, Limits, parse_chat, parse_completion, require_model,
                                  with_default_tag, without_default_tag)
from gateway.openai.routes import Admitted, admit_chat, admit_completion, check_would_fit
from gateway.openai.validation import validate
from gateway.server.client_io import collect_unless_disconnected, one_line_json, read_json
from gateway.server.deadlines import request_deadline
from gateway.server.errors import ApiError
from gateway.server.task_guard import require_task
from gateway.server.version import mili_version
from gateway.streams.choice_stream import ChoiceEvent

log = logging.getLogger("mili.gateway")
NDJSON = "application/x-ndjson"


async def chat(request: Request) -> Response:
    state = request.app.state.mili
    body = validate(OllamaChatBody, await read_json(request, state.settings.max_body_bytes), ())
    return await _generate(request, body, "chat")


async def generate(request: Request) -> Response:
    state = request.app.state.mili
    body = validate(OllamaGenerateBody, await read_json(request, state.settings.max_body_bytes), ())
    return await _generate(request, body, "generate")


async def _generate(request: Request, body: OllamaChatBody | OllamaGenerateBody, kind: str) -> Response:
    state = request.app.state.mili
    require_task(state.engine_config.task, "generate")
    served = state.settings.served_model_names
    require_model(without_default_tag(body.model, served), served)
    if body.think not in (None, False) and not state.text.split_reasoning:  # /api/show lists no "thinking"
        raise ApiError(400, f"{json.dumps(body.model)} does not support thinking", "think")  # as Ollama words it
    output = OllamaOutput(kind, body.model, state.token_names, bool(body.logprobs))
    deadline = request_deadline(request, state.settings.request_timeout)
    with ollama_names():
        parsed = _parsed(kind, body, served, state.settings.limits)
        if (kind == "chat" and not body.messages) or (kind == "generate" and not body.prompt):
            check_would_fit(state, parsed.params)
            return JSONResponse(output.load())
        if isinstance(parsed, CompletionRequest):
            admitted, _ = await admit_completion(request, parsed, deadline)
        else:
            admitted, _ = await admit_chat(request, parsed, deadline)
    if body.stream:
        return StreamingResponse(_lines(output, admitted), media_type=NDJSON, background=BackgroundTask(admitted.abort))
    try:
        # Fed as they arrive, not once all have: the first one's arrival ends the prompt's timing.
        await collect_unless_disconnected(request, _fed(output, admitted.events()))
    finally:
        admitted.abort()
    return JSONResponse(output.whole(admitted.usage))


def _parsed(kind: str, body: OllamaChatBody | OllamaGenerateBody, served: tuple[str, ...],
            limits: Limits) -> ChatRequest | CompletionRequest:
    """The chat (raw generate: completion) request the body translates into, through every check such a request
    gets. A request with nothing to generate (Ollama's way to load a model) is checked as one empty user turn,
    so that a body is valid or not whatever its messages, and then not run."""
    translated = chat_body(body, served) if kind == "chat" else generate_body(body, served)
    if "prompt" in translated:  # without num_predict: until the context ends, as for chat (not a completion's 16)
        return parse_completion(translated, limits, default_max_tokens=None)
    translated["messages"] = translated.get("messages") or [{"role": "user", "content": ""}]
    return parse_chat(translated, limits)


async def _fed(output: OllamaOutput, events: AsyncIterator[ChoiceEvent]) -> AsyncIterator[None]:
    async for e in events:
        output.feed(e)
        yield None


async def _lines(output: OllamaOutput, admitted: Admitted) -> AsyncIterator[str]:
    try:
        async for e in admitted.events():
            if (chunk := output.feed(e)) is not None:
                yield _line(chunk)
        if (calls := output.tool_calls_chunk()) is not None:
            yield _line(calls)
        yield _line(output.final(admitted.usage))
    except ApiError as e:
        log.warning("stream ended with an error: %s", e.message)
        yield _line({"error": e.message})
    finally:
        admitted.abort()  # the client left, or the stream ended: drop the request in its worker, end its count


def _line(obj: dict[str, Any]) -> str:
    return one_line_json(obj) + "\n"


async def tags(request: Request) -> Response:
    state = request.app.state.mili
    return JSONResponse({"models": [_model_entry(state, name) for name in state.settings.served_model_names]})


async def ps(request: Request) -> Response:
    state = request.app.state.mili
    entry = _model_entry(state, state.settings.served_model_name)
    info = state.pool.info
    on_gpu = info is not None and info.device.startswith("cuda")
    entry.update(expires_at="9999-12-31T23:59:59Z", size_vram=entry["size"] if on_gpu else 0,
                 context_length=info.max_model_len if info is not None else None)
    return JSONResponse({"models": [entry] if info is not None else []})


async def pull(request: Request) -> Response:
    """Ollama clients pull a model before using it: the served one is here already, so the pull succeeds at once."""
    state = request.app.state.mili
    body = validate(OllamaPullBody, await read_json(request, state.settings.max_body_bytes), ())
    _served_name(state, body.model or body.name, " (it pulls no other)")
    if body.stream:
        return Response(_line({"status": "success"}), media_type=NDJSON)
    return JSONResponse({"status": "success"})


def _served_name(state, name: str | None, refusal_note: str = "") -> str:
    """The served model a request names (by any of its names, with or without Ollama's :latest tag)."""
    if not name:
        raise ApiError(400, "model is required", "model")
    served = state.settings.served_model_names
    if without_default_tag(name, served) not in served:
        raise ApiError(404, f"model '{name}' not found; this server serves '{with_default_tag(served[0])}'"
                       + refusal_note, "model")
    return name


async def show(request: Request) -> Response:
    state = request.app.state.mili
    body = validate(OllamaShowBody, await read_json(request, state.settings.max_body_bytes), ())
    _served_name(state, body.model or body.name)
    served = state.settings.served_model_names
    entry = _model_entry(state, served[0])
    info = state.pool.info
    arch = entry["details"]["family"]
    model_info: dict[str, Any] = {"general.architecture": arch, "general.basename": served[0]}
    if info is not None:
        model_info[f"{arch}.context_length"] = info.max_model_len
        model_info[f"{arch}.vocab_size"] = info.vocab_size
    template = state.text.template.source if state.engine_config.task == "generate" else None
    return JSONResponse({
        "license": "", "modelfile": f"# served by MILI\nFROM {state.engine_config.model}\n", "parameters": "",
        "template": template or "", "details": entry["details"], "model_info": model_info,
        "capabilities": _capabilities(state), "modified_at": entry["modified_at"]})


async def version(request: Request) -> Response:
    """MILI's own version: this is not Ollama, and says so."""
    return JSONResponse({"version": mili_version()})


def _capabilities(state) -> list[str]:
    if state.engine_config.task != "generate":
        return ["embedding"] if state.engine_config.task == "embed" else []
    capabilities = ["completion", "tools"]  # tools: the template's own format, or the generic one (tool_specs.py)
    if state.text.split_reasoning:
        capabilities.append("thinking")
    return capabilities


def _model_entry(state, name: str) -> dict[str, Any]:
    """The served model under one of its names, as /api/tags lists it. The digest identifies the served name and
    weights' path, not an Ollama manifest (there is none), and is one for all the names, as `ollama cp`'s copies
    share theirs; the size is the weights' files on disk."""
    served, path = state.settings.served_model_name, Path(state.engine_config.model)
    files = [path] if path.is_file() else [p for p in path.glob("*") if p.suffix in (".safetensors", ".gguf", ".bin")]
    info = state.pool.info
    arch = (info.architecture if info is not None else "").removesuffix("ForCausalLM").lower() or "unknown"
    quantization = info.quantization if info is not None and info.quantization != "none" else (
        info.dtype if info is not None else "")
    return {"name": with_default_tag(name), "model": with_default_tag(name),
            "modified_at": datetime.fromtimestamp(state.started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "size": sum(f.stat().st_size for f in files if f.is_file()),
            "digest": hashlib.sha256(f"{served}\n{path}".encode()).hexdigest(),
            "details": {"parent_model": "", "family": arch, "families": [arch], "parameter_size": "",
                        "format": "gguf" if any(f.suffix == ".gguf" for f in files) else "safetensors",
                        "quantization_level": quantization.upper()}}
