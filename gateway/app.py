"""The gateway's Starlette application: routes, error objects, lifespan of the workers (API keys: gateway/server/auth.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway import openapi
from gateway.anthropic.routes import count_tokens, messages
from gateway.huggingface import routes as huggingface
from gateway.huggingface import tei_routes, tgi_routes
from gateway.huggingface.errors import TEI, TGI, answered_in, dialect_of
from gateway.llamacpp import routes as llamacpp
from gateway.ollama import routes as ollama
from gateway.metrics.mili_metrics import Metrics
from gateway.openai.parse import Limits
from gateway.openai.response_bodies import TokenNames
from gateway.openai.routes import chat_completions, completions
from gateway.openai.model_routes import list_models, retrieve_model
from gateway.openai.tokenize_routes import detokenize, tokenize
from gateway.pooling import routes as pooling
from gateway.responses_api.routes import input_tokens, response_input_items, responses, stored_response
from gateway.responses_api.store import ResponseStore
from gateway.server import debug_routes
from gateway.server.auth import ApiKey, ApiKeyMiddleware, KeyRing, load_keys
from gateway.server.client_io import ClientDisconnected
from gateway.server.errors import ANTHROPIC_VERSION_HEADER, ApiError
from gateway.server.key_limits import KeyLimits
from gateway.server.request_id import RequestIdMiddleware
from gateway.server.route_aliases import ALIASES
from gateway.server.version import mili_version
from gateway.streams.resume_buffer import StreamRegistry
from gateway.streams.resume_routes import resume_stream
from gateway.text.served_model_text import ModelText
from gateway.web_ui import routes as web_ui
from gateway.workers.pool import WorkerPool
from shared import wire
from shared.config import EngineConfig
from shared.pooling_config import read_pooling_config

log = logging.getLogger("mili.gateway")


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str  # what answers carry
    served_model_aliases: tuple[str, ...] = ()  # more names a request may ask for (vLLM's extra --served-model-name)
    api_key: str | None = None
    api_keys: dict[str, ApiKey] | None = None  # secret -> key (auth.load_keys); None: just api_key, if any
    limits: Limits = Limits()
    max_body_bytes: int = 16 << 20
    max_waiting_requests: int = 512  # beyond what the workers run at once
    sse_ping_s: float = 5.0
    num_workers: int = 1
    worker_threads: int = 0  # torch threads per worker; 0: the cores divided among the workers
    worker_tcp_host: str | None = None
    worker_tcp_port: int = 5555
    request_timeout: float | None = None  # seconds; a request's deadline when it sends no X-Request-Timeout
    enable_debug_faults: bool = False  # POST /debug/kv/fault (drills and tests only)
    stream_resume_ttl: float = 0.0  # seconds a disconnected stream waits to be resumed; 0: abort at once
    stream_resume_max_bytes: int = 64 << 20  # all resumable streams' buffered events together
    responses_store_max_bytes: int = 64 << 20  # stored Responses API responses together; 0: none is stored
    web_ui: bool = True  # the chat page at / (gateway/web_ui/)
    chat_template: str | None = None  # --chat-template's source, replacing the model's template
    default_chat_template_kwargs: dict | None = None  # under every request's chat_template_kwargs

    @property
    def served_model_names(self) -> tuple[str, ...]:
        return (self.served_model_name, *self.served_model_aliases)


class GatewayState:
    def __init__(self, settings: ServerSettings, engine_config: EngineConfig):
        self.settings = settings
        self.engine_config = engine_config
        self.text = ModelText(engine_config.model, settings.chat_template, settings.default_chat_template_kwargs)
        self.token_names = TokenNames(self.text.tokenizer)
        self.metrics = Metrics(settings.served_model_name, engine_config.block_size, engine_config.task)
        # --task embed|score: how the checkpoint pools (its embedding size, its scorer); None when generating.
        self.pooling = None if engine_config.task == "generate" else read_pooling_config(engine_config.model,
                                                                                           engine_config.task)
        keys = settings.api_keys if settings.api_keys is not None else load_keys(settings.api_key, None)
        self.keyring = KeyRing(keys)
        self.key_limits = KeyLimits(self.keyring.keys, self.metrics.registry, settings.served_model_name)
        threads = settings.worker_threads or max(1, (os.cpu_count() or 1) // settings.num_workers)
        self.pool = WorkerPool(engine_config, settings.served_model_name, settings.num_workers, threads,
                               tcp_host=settings.worker_tcp_host, tcp_port=settings.worker_tcp_port,
                               on_stats=self._on_worker_stats, debug_faults=settings.enable_debug_faults,
                               on_bad_config=self._stop_serving)
        self.capacity = settings.num_workers * engine_config.max_num_seqs + settings.max_waiting_requests
        self.streams = (StreamRegistry(settings.stream_resume_ttl, settings.stream_resume_max_bytes, self.metrics)
                        if settings.stream_resume_ttl > 0 else None)
        self.responses = (ResponseStore(settings.responses_store_max_bytes)
                          if settings.responses_store_max_bytes > 0 else None)
        self.draining = False
        self.started = int(time.time())
        self.fatal: str | None = None  # why the server stopped itself: a model its workers cannot serve
        self.stop_server: Callable[[], None] = lambda: None  # set by whatever runs the app (gateway/serve.py)

    def _stop_serving(self, reason: str) -> None:
        """A worker cannot serve the model as configured: every restart would fail alike, so the server exits
        instead of answering 503 forever."""
        if self.fatal is None:
            self.fatal = reason
            self.stop_server()

    def _on_worker_stats(self, slot, previous: wire.WorkerStats | None, stats: wire.WorkerStats) -> None:
        self.metrics.worker_counters(previous, stats)

    def refresh_gauges(self) -> None:
        live = [s.stats for s in self.pool.slots if s.is_ready and s.stats is not None]
        self.metrics.worker_stats(live, len(self.pool.ready_slots))
        if self.responses is not None:
            self.metrics.responses_store(len(self.responses), self.responses.bytes)


Handler = Callable[[Request], Awaitable[Response]]


def _api(handler: Handler) -> Handler:
    """Every failure becomes an error object of the route's API; a client that left gets nothing."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return e.response_for(request.url.path, ANTHROPIC_VERSION_HEADER in request.headers)
        except ClientDisconnected:
            return Response(status_code=499)
        except Exception:
            log.exception("unexpected error serving %s", request.url.path)
            return ApiError(500, "internal server error").response_for(request.url.path)

    return wrapped


async def health(request: Request) -> Response:
    state: GatewayState = request.app.state.mili
    pool = state.pool
    if state.draining:
        return JSONResponse({"status": "draining", "reason": "the server is shutting down"}, status_code=503)
    info = pool.info
    if info is None:
        reason = "; ".join(pool.down_reasons()) or "starting"
        return JSONResponse({"status": "unavailable", "reason": reason}, status_code=503)
    return JSONResponse({
        "status": "ok", "model": state.settings.served_model_name, "task": state.engine_config.task,
        "device": info.device,
        "attention_backend": info.attention_backend, "layer_ops": info.layer_ops, "decode_graphs": info.decode_graphs,
        "quantization": info.quantization, "activation_quantization": info.activation_quantization,
        "speculative_decoding": info.speculative_decoding,
        "dtype": info.dtype, "architecture": info.architecture, "max_model_len": info.max_model_len,
        "workers": len(pool.slots), "workers_ready": len(pool.ready_slots), "workers_down": pool.down_reasons()})


async def metrics(request: Request) -> Response:
    state: GatewayState = request.app.state.mili
    state.refresh_gauges()
    return Response(state.metrics.render(), media_type=state.metrics.content_type)


async def version(request: Request) -> Response:
    """MILI's version. Routers of the SGLang lineage (SMG) also read the presence of GET /version as "this backend
    speaks vLLM's protocol", which MILI does for its metrics (gateway/metrics/router_metrics.py), so they poll its load."""
    return JSONResponse({"version": mili_version(), "server": "mili"})


async def openapi_json(request: Request) -> Response:
    state: GatewayState = request.app.state.mili
    info = state.pool.info
    return JSONResponse(openapi.document(openapi.ServedBounds(
        state.settings.served_model_names, state.settings.limits, info and info.vocab_size, info and info.max_model_len,
        state.engine_config.task, state.text.split_reasoning, state.settings.web_ui, state.text.fim is not None,
        state.pooling.dimensions if state.pooling is not None else None)))


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Starlette's routing errors (404, 405) as OpenAI error objects, keeping their headers (a 405's
    `Allow` lists the route's methods)."""
    message = exc.detail or "not found"
    if exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    return ApiError(exc.status_code, message, headers=dict(exc.headers or {})).response_for(request.url.path)


def _aliases(routes: list[Route]) -> list[Route]:
    """The routes' other spellings (gateway/server/route_aliases.py), each answered by its route's endpoint."""
    by_path = {route.path: route for route in routes if isinstance(route, Route)}
    return [Route(alias, by_path[path].endpoint, methods=sorted(by_path[path].methods - {"HEAD"}))
            for alias, path in ALIASES.items()]


def build_app(settings: ServerSettings, engine_config: EngineConfig) -> Starlette:
    state = GatewayState(settings, engine_config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state.pool.start()
        try:
            yield
        finally:
            if state.streams is not None:
                state.streams.close()
            await state.pool.stop()

    root_post = _api(answered_in(dialect_of, huggingface.root))
    routes = [
        Route("/v1/completions", _api(completions), methods=["POST"]),
        Route("/v1/chat/completions", _api(chat_completions), methods=["POST"]),
        Route("/v1/responses", _api(responses), methods=["POST"]),
        Route("/v1/responses/input_tokens", _api(input_tokens), methods=["POST"]),
        Route("/v1/responses/{response_id}", _api(stored_response), methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/input_items", _api(response_input_items), methods=["GET"]),
        Route("/v1/embeddings", _api(pooling.embeddings), methods=["POST"]),
        Route("/v1/rerank", _api(tei_routes.rerank_either), methods=["POST"]),
        Route("/rerank", _api(tei_routes.rerank_either), methods=["POST"]),
        Route("/v2/rerank", _api(pooling.cohere_rerank), methods=["POST"]),
        Route("/score", _api(pooling.score), methods=["POST"]),
        Route("/v1/score", _api(pooling.score), methods=["POST"]),
        Route("/v1/messages", _api(messages), methods=["POST"]),
        Route("/v1/messages/count_tokens", _api(count_tokens), methods=["POST"]),
        Route("/api/chat", _api(ollama.chat), methods=["POST"]),
        Route("/api/generate", _api(ollama.generate), methods=["POST"]),
        Route("/api/embed", _api(pooling.ollama_embed), methods=["POST"]),
        Route("/api/embeddings", _api(pooling.ollama_embeddings), methods=["POST"]),
        Route("/embedding", _api(pooling.llama_embedding), methods=["POST"]),  # llama.cpp server's
        Route("/embeddings", _api(pooling.llama_embedding), methods=["POST"]),
        Route("/api/tags", _api(ollama.tags), methods=["GET"]),
        Route("/api/show", _api(ollama.show), methods=["POST"]),
        Route("/api/pull", _api(ollama.pull), methods=["POST"]),
        Route("/api/ps", _api(ollama.ps), methods=["GET"]),
        Route("/api/version", _api(ollama.version), methods=["GET"]),
        # Hugging Face's TGI (generate) and TEI (embed, rerank): their own routes, errors in their shape.
        Route("/generate", _api(answered_in(lambda _: TGI, tgi_routes.generate)), methods=["POST"]),
        Route("/generate_stream", _api(answered_in(lambda _: TGI, tgi_routes.generate_stream)), methods=["POST"]),
        Route("/embed", _api(answered_in(lambda _: TEI, tei_routes.embed)), methods=["POST"]),
        Route("/similarity", _api(answered_in(lambda _: TEI, tei_routes.similarity)), methods=["POST"]),
        Route("/info", _api(answered_in(dialect_of, huggingface.info)), methods=["GET"]),
        Route("/completion", _api(llamacpp.completion), methods=["POST"]),
        Route("/completions", _api(llamacpp.completion), methods=["POST"]),
        Route("/infill", _api(llamacpp.infill), methods=["POST"]),
        Route("/props", _api(llamacpp.props), methods=["GET"]),
        Route("/apply-template", _api(llamacpp.apply_template), methods=["POST"]),
        Route("/tokenize", _api(tokenize), methods=["POST"]),
        Route("/detokenize", _api(detokenize), methods=["POST"]),
        Route("/v1/streams/{stream_id}", _api(resume_stream), methods=["GET"]),
        Route("/v1/models", _api(list_models), methods=["GET"]),
        Route("/v1/models/{model:path}", _api(retrieve_model), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/version", version, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/debug/kv", _api(debug_routes.kv_ledger), methods=["GET"]),
        *([Route("/debug/kv/fault", _api(debug_routes.inject_kv_fault), methods=["POST"])]
          if settings.enable_debug_faults else []),
        # POST /: TGI's or TEI's route; GET /: the chat page.
        *(web_ui.routes(thinking=state.text.split_reasoning, post=root_post) if settings.web_ui
          else [Route("/", root_post, methods=["POST"])]),
    ]
    app = Starlette(routes=routes + _aliases(routes), exception_handlers={HTTPException: _http_error},
                    lifespan=lifespan)
    app.state.mili = state
    app.add_middleware(ApiKeyMiddleware, keyring=state.keyring, on_refused=state.metrics.unauthorized,
                       is_public=web_ui.is_public if settings.web_ui else None)
    # Outermost: a refused request gets its id too, and is counted.
    app.add_middleware(RequestIdMiddleware, on_api_response=state.metrics.http_response)
    return app
