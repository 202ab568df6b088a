"""`mili serve`: resolve the model, build the app, run uvicorn, drain on SIGTERM.

Draining: the first SIGTERM (or Ctrl-C) closes the listening socket (new connections are refused) and the
idle keep-alive connections, while running requests, streams included, finish; a request that still reaches
the app on a connection open during the drain gets 503 (`draining`; /health too). After --drain-timeout
seconds the rest are cut off and the workers are stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

import uvicorn
from sse_starlette.sse import AppStatus

from gateway.app import ServerSettings, build_app
from gateway.openai.parse import Limits, served_names_text
from gateway.server.auth import load_keys
from gateway.server.device_check import check_device
from gateway.text.chat_template import parse_template_kwargs, read_template_file
from shared.config import (ACTIVATION_QUANTIZATIONS, ATTENTION_BACKENDS, DTYPES, KV_CACHE_DTYPES, QUANTIZATIONS,
                           SCHEDULING_POLICIES, EngineConfig, parse_size)
from shared.pooling_config import TASKS, resolve_task
from shared.speculative_config import SpeculativeConfig, parse_speculative_config

log = logging.getLogger("mili.gateway")


def _attention_backend(value: str) -> str:
    if value not in ATTENTION_BACKENDS:
        raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(ATTENTION_BACKENDS)})")
    return value


def _speculative_config(value: str) -> SpeculativeConfig | None:
    try:
        return parse_speculative_config(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _hf_overrides(value: str) -> dict:
    try:
        overrides = json.loads(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from e
    if not isinstance(overrides, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object of config.json keys, got {value!r}")
    return overrides


def add_arguments(p: argparse.ArgumentParser) -> None:
    # Each flag below that names an environment variable takes its default from it (the container image sets
    # MILI_HOST=0.0.0.0); a flag given on the command line wins.
    p.add_argument("--model", default=os.environ.get("MILI_MODEL", "default"),
                   help="an HF-format directory, a .gguf file (converted once into the cache), or 'default' "
                        "(or set MILI_MODEL)")
    p.add_argument("--served-model-name", nargs="+", metavar="NAME",
                   help="the name clients ask for (default: the model's directory name); more names are aliases a "
                        "request may ask for too, as vLLM's (answers carry the name asked for)")
    p.add_argument("--host", default=os.environ.get("MILI_HOST", "127.0.0.1"),
                   help="address to listen on (or set MILI_HOST; default 127.0.0.1)")
    # A string default goes through type=int, so a bad MILI_PORT is a clean usage error.
    p.add_argument("--port", type=int, default=os.environ.get("MILI_PORT", "8000"),
                   help="port to listen on (or set MILI_PORT; default 8000)")
    p.add_argument("--api-key", default=os.environ.get("MILI_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every route but /health (or set MILI_API_KEY)")
    p.add_argument("--api-keys-file", metavar="PATH",
                   help="accept the keys listed in PATH, one per line as 'KEY [name=NAME] [weight=W] "
                        "[max_concurrent=N]' ('#' comments); requests are admitted weighted-fair between "
                        "keys, and a key over its max_concurrent gets 429 (with --api-key: one more key)")
    p.add_argument("--device", default=os.environ.get("MILI_DEVICE", "auto"), metavar="{auto,cpu,cuda}",
                   help="where the model runs (or set MILI_DEVICE): auto = cuda where torch sees a CUDA device, "
                        "else cpu; cuda[:N] fails at once where CUDA is unavailable. On cuda: bfloat16 weights and "
                        "KV cache on the GPU, attention through the torch reference")
    p.add_argument("--dtype", choices=DTYPES, default="auto")
    p.add_argument("--max-model-len", type=int,
                   help="the longest prompt + output, in tokens (default: the model's context length, stretched by "
                        "its rope_scaling; lowered to what the KV cache holds)")
    p.add_argument("--hf-overrides", metavar="JSON", type=_hf_overrides,
                   help='config.json keys to replace (an object merges key by key), e.g. YaRN for long contexts: '
                        '\'{"rope_scaling": '
                        '{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}\'')
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-kv-blocks", type=int)
    p.add_argument("--kv-cache-memory", type=parse_size, default="1GiB", help="KV cache size per worker (e.g. 4GiB)")
    # type= checks the environment's value too (argparse checks choices only on the command line).
    p.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, type=_attention_backend,
                   default=os.environ.get("MILI_ATTENTION_BACKEND", "auto"),
                   help="auto = on the CPU the Mojo kernels where they load, else the torch reference; on a GPU "
                        "the torch reference (the GPU module only as mojo: not yet verified) (or set "
                        "MILI_ATTENTION_BACKEND)")
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                   help="KV cache dtype: auto (the model's; float16 where --dtype auto gave float32, on a CPU without "
                        "bfloat16 arithmetic), bfloat16, float16 (beside a float32 model: half its memory), or int8 "
                        "(a scale per token and KV head; about half the memory of bfloat16, so "
                        "about twice the sequences in one --kv-cache-memory)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="auto",
                   help="linear weights: auto = a GGUF's own Q4_0/Q4_1/Q8_0 and Q4_K/Q6_K/Q5_0/Q5_1 blocks "
                        "(none for safetensors); "
                        "q8_0/q4_0 quantize a checkpoint at load; none = the model dtype")
    p.add_argument("--activation-quantization", choices=ACTIVATION_QUANTIZATIONS, default="auto",
                   help="how quantized weights' matmuls quantize activations: int8x2 = two int8 parts per "
                        "activation (about 15 bits), int8 = one, as llama.cpp does (about twice the prefill "
                        "throughput, about 8 bits); int8-prompt = int8 for prompt positions, int8x2 for generated "
                        "ones; auto = int8 for --task embed and score, int8x2 for generate. "
                        "No effect without quantized weights")
    p.add_argument("--task", choices=TASKS, default="auto",
                   help="what the model serves: generate (chat and completions), embed (/v1/embeddings) or score "
                        "(/v1/rerank, /score); auto reads the checkpoint: sentence-transformers files mean embed, a "
                        "sequence-classification head or a Qwen3-Reranker mean score, anything else generate")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs",
                   help="fcfs: waiting requests in arrival order (fair between API keys); priority: by each "
                        "request's priority (lower first; fair between keys within one priority), and the lowest "
                        "priority is preempted first. Under fcfs a request's priority other than 0 is a 400")
    p.add_argument("--speculative-config", metavar="JSON", type=_speculative_config,
                   help='speculative decoding, vLLM\'s keys: {"method": "ngram", "num_speculative_tokens": 4, '
                        '"prompt_lookup_min": 2, "prompt_lookup_max": 5} (default: off)')
    p.add_argument("--enforce-eager", action="store_true",
                   help="on CUDA, run decode steps eagerly instead of replaying CUDA graphs, and the layers' "
                        "operators one by one instead of torch.compile's fused kernels")
    p.add_argument("--workers", type=int, default=1, help="engine processes behind this gateway")
    p.add_argument("--worker-threads", type=int, default=0, help="torch threads per worker (0: cores / workers)")
    p.add_argument("--worker-tcp", metavar="HOST:PORT",
                   help="talk to workers over tcp from PORT up (default: ipc sockets in a private directory)")
    p.add_argument("--max-body-size", type=parse_size, default="16MiB")
    p.add_argument("--max-n", type=int, default=Limits.max_n)
    p.add_argument("--max-stop-strings", type=int, default=Limits.max_stop)
    p.add_argument("--max-stop-length", type=int, default=Limits.max_stop_length)
    p.add_argument("--max-waiting-requests", type=int, default=512,
                   help="requests queued beyond what the workers run at once before new ones get 503")
    p.add_argument("--sse-ping-interval", type=float, default=5.0, help="seconds between SSE keep-alive comments")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--request-timeout", type=float, default=0.0,
                   help="seconds a request may take end to end, queue included, when it sends no "
                        "X-Request-Timeout header (0: no limit)")
    p.add_argument("--stream-resume-ttl", type=float, default=0.0,
                   help="seconds a stream whose client disconnected keeps running, resumable with GET "
                        "/v1/streams/{id} and Last-Event-ID (every event then carries an id, the response an "
                        "X-Stream-Id header); also how long a finished stream's events are kept. 0: a disconnect "
                        "aborts the request at once")
    p.add_argument("--stream-resume-buffer", type=parse_size, default="64MiB",
                   help="bytes of events all resumable streams may keep together; past it the streams nobody "
                        "reads are dropped first, the one idle longest first")
    p.add_argument("--responses-store-buffer", type=parse_size, default="64MiB",
                   help="bytes of Responses API responses kept together for previous_response_id and GET "
                        "/v1/responses/{id} (requests with store: true, the default); past it the response read "
                        "least recently goes first. 0: none is kept")
    p.add_argument("--enable-debug-faults", action="store_true",
                   help="add POST /debug/kv/fault, which breaks the KV block accounting on purpose (drills, tests)")
    p.add_argument("--no-web-ui", action="store_true",
                   help="do not serve the chat page at / (and its assets under /web-ui/)")
    p.add_argument("--chat-template", metavar="FILE",
                   help="a Jinja chat template file that replaces the model's own")
    p.add_argument("--default-chat-template-kwargs", metavar="JSON", default=None,
                   help="template variables every chat request gets, as a JSON object (e.g. "
                        "'{\"enable_thinking\": false}'); a request's chat_template_kwargs win")
    p.add_argument("--log-level", default="info")


def resolve_model(model: str) -> tuple[Path, str]:
    """The HF-format directory to serve and the name it is served under by default."""
    from shared.default_model import DEFAULT_SERVED_NAME, converted_gguf, default_model_path

    if model == "default":
        return default_model_path(), DEFAULT_SERVED_NAME
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return converted_gguf(path, path.stem), path.stem
    if not (path / "config.json").is_file():
        raise ValueError(f"--model {model}: not an HF-format directory (no config.json) nor a .gguf file")
    return path, path.name


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state):
        super().__init__(config)
        self.mili_state = state
        state.stop_server = self.stop_without_signal

    def stop_without_signal(self) -> None:
        """Shut down as for a SIGTERM, without one for uvicorn to raise again at exit (the exit code says why)."""
        self.mili_state.draining = True
        self.should_exit = True

    def handle_exit(self, sig, frame) -> None:
        if not self.mili_state.draining:
            log.info("draining: no new requests; running ones get up to %.0f s",
                     self.config.timeout_graceful_shutdown)
        self.mili_state.draining = True
        super().handle_exit(sig, frame)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.request_timeout < float("inf"):
        raise ValueError(f"--request-timeout must be 0 (no limit) or a number of seconds, got {args.request_timeout}")
    if not 0 <= args.stream_resume_ttl < float("inf"):
        raise ValueError(f"--stream-resume-ttl must be 0 (off) or a number of seconds, got {args.stream_resume_ttl}")
    if args.stream_resume_buffer <= 0:
        raise ValueError(f"--stream-resume-buffer must be above 0, got {args.stream_resume_buffer}")
    api_keys = load_keys(args.api_key, args.api_keys_file)  # a bad keys file fails before the model loads
    chat_template = read_template_file(args.chat_template) if args.chat_template else None
    template_kwargs = (parse_template_kwargs(args.default_chat_template_kwargs)
                       if args.default_chat_template_kwargs is not None else {})
    EngineConfig(model="", device=args.device, attention_backend=args.attention_backend, quantization=args.quantization,
                 kv_cache_dtype=args.kv_cache_dtype)  # the device flags' combinations, before anything slow
    if args.device.startswith("cuda"):
        check_device(args.device)
    model_dir, default_name = resolve_model(args.model)
    task = resolve_task(args.task, model_dir)
    engine_config = EngineConfig(
        model=str(model_dir), device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
        num_kv_blocks=args.num_kv_blocks, kv_cache_memory=args.kv_cache_memory,
        attention_backend=args.attention_backend, quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype,
        activation_quantization=args.activation_quantization, enable_prefix_caching=not args.no_prefix_caching,
        enforce_eager=args.enforce_eager,
        scheduling_policy=args.scheduling_policy, task=task,
        speculative_config=args.speculative_config, hf_overrides=args.hf_overrides)
    tcp_host, tcp_port = None, 0
    if args.worker_tcp:
        tcp_host, _, port = args.worker_tcp.rpartition(":")
        tcp_port = int(port)
    names = tuple(dict.fromkeys(args.served_model_name or (default_name,)))  # each once, in the order given
    settings = ServerSettings(
        served_model_name=names[0], served_model_aliases=names[1:], api_key=args.api_key, api_keys=api_keys,
        limits=Limits(max_n=args.max_n, max_stop=args.max_stop_strings, max_stop_length=args.max_stop_length,
                      priorities=args.scheduling_policy == "priority"),
        max_body_bytes=args.max_body_size, max_waiting_requests=args.max_waiting_requests,
        sse_ping_s=args.sse_ping_interval, num_workers=args.workers, worker_threads=args.worker_threads,
        worker_tcp_host=tcp_host, worker_tcp_port=tcp_port, request_timeout=args.request_timeout or None,
        enable_debug_faults=args.enable_debug_faults, stream_resume_ttl=args.stream_resume_ttl,
        stream_resume_max_bytes=args.stream_resume_buffer, chat_template=chat_template,
        responses_store_max_bytes=args.responses_store_buffer,
        # The chat page is a client of /v1/chat/completions, which only a generating server answers.
        web_ui=not args.no_web_ui and task == "generate",
        default_chat_template_kwargs=template_kwargs)
    app = build_app(settings, engine_config)
    # Running streams finish during the drain; sse-starlette would otherwise end them at the first SIGTERM.
    AppStatus.disable_automatic_graceful_drain()
    # Named rather than "auto", so a missing install fails at start instead of silently serving slower.
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=args.drain_timeout, access_log=False,
                            loop="uvloop", http="httptools")
    server = _DrainingServer(config, app.state.mili)
    log.info("serving %s as %s (task %s%s) on http://%s:%d%s", model_dir, served_names_text(names), task,
             ", from the checkpoint" if args.task == "auto" else "", args.host, args.port,
             " (chat page at /)" if settings.web_ui else "")
    server.run()
    if app.state.mili.fatal is not None:
        log.error("stopped: %s", app.state.mili.fatal)
        return 1
    return 0
