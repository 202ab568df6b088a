"""Typed messages between the gateway and its workers, and their msgpack framing.

Every frame is a msgpack map with a "type" and the fields that type declares. `decode` checks the frame
size, the type, every field's presence and type, and refuses anything it does not know, so a malformed
frame raises `WireError` and is never acted upon. Nothing is ever unpickled.

gateway -> worker: AddRequest, AbortRequests, AbortChoices (some choices of an n > 1 request)
worker -> gateway: WorkerReady, StepOutputs (token deltas and stats after every step), Heartbeat
                   (stats while idle), RequestFailed (a request the engine refused)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

# A prompt of a million token ids packs to about 5 MB; anything far beyond is not a request.
MAX_FRAME_BYTES = 64 << 20


class WireError(ValueError):
    """A frame that is not a valid message."""


@dataclass(frozen=True)
class WorkerStats:
    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    prefix_cache_query_tokens: int  # cumulative since the worker started
    prefix_cache_hit_tokens: int
    num_preemptions: int


@dataclass(frozen=True)
class AddRequest:
    TYPE: ClassVar[str] = "add"
    request_id: str
    prompt_token_ids: list[int]
    params: dict[str, Any]  # SamplingParams fields; the worker builds (and so validates) SamplingParams


@dataclass(frozen=True)
class AbortRequests:
    TYPE: ClassVar[str] = "abort"
    request_ids: list[str]


@dataclass(frozen=True)
class AbortChoices:
    """Stop some choices of one request (each ended on a stop string in the gateway); the others run on."""

    TYPE: ClassVar[str] = "abort_choices"
    request_id: str
    indices: list[int]


@dataclass(frozen=True)
class WorkerReady:
    TYPE: ClassVar[str] = "ready"
    model: str
    architecture: str
    dtype: str
    attention_backend: str
    max_model_len: int
    vocab_size: int
    stats: WorkerStats


@dataclass(frozen=True)
class TokenDelta:
    """New tokens of one choice. logprobs, when asked for: one [token_id, logprob, [[id, logprob], ...]]
    per new token. prompt_logprobs, when asked for, once per request (on choice 0's first delta): one
    [token_id, logprob, rank, [[id, logprob], ...]] per prompt token after the first."""

    request_id: str
    index: int
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list[list[Any]] | None = None
    stop_token_id: int | None = None
    queue_time: float | None = None  # seconds waited before first scheduled, on a choice's first delta
    prompt_logprobs: list[list[Any]] | None = None


@dataclass(frozen=True)
class StepOutputs:
    TYPE: ClassVar[str] = "outputs"
    deltas: list[TokenDelta]
    stats: WorkerStats


@dataclass(frozen=True)
class Heartbeat:
    TYPE: ClassVar[str] = "heartbeat"
    stats: WorkerStats


@dataclass(frozen=True)
class RequestFailed:
    TYPE: ClassVar[str] = "failed"
    request_id: str
    message: str
    param: str | None = None


MESSAGE_TYPES = {cls.TYPE: cls for cls in (AddRequest, AbortRequests, WorkerReady, StepOutputs, Heartbeat,
                                           RequestFailed, AbortChoices)}
Message = AddRequest | AbortRequests | WorkerReady | StepOutputs | Heartbeat | RequestFailed | AbortChoices


def encode(message: Message) -> bytes:
    body = dataclasses.asdict(message)
    body["type"] = message.TYPE
    return msgpack.packb(body, use_bin_type=True)


def decode(frame: bytes, allowed: tuple[type, ...]) -> Message:
    """Parse and validate one frame; only the message classes in `allowed` are accepted."""
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        body = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for corrupt input
        raise WireError(f"not a msgpack frame: {e}") from e
    if not isinstance(body, dict):
        raise WireError("a frame must be a map")
    cls = MESSAGE_TYPES.get(body.pop("type", None))
    if cls is None or cls not in allowed:
        raise WireError(f"unexpected message type {body.get('type')!r}")
    return _build(cls, body, cls.__name__)


_SCALARS = {int: (int,), float: (float, int), str: (str,), bool: (bool,)}


def _build(cls: type, body: Any, where: str) -> Any:
    if not isinstance(body, dict):
        raise WireError(f"{where}: expected a map")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(body) - set(fields)
    if unknown:
        raise WireError(f"{where}: unknown fields {sorted(unknown)}")
    values = {}
    for name, f in fields.items():
        if name not in body:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise WireError(f"{where}: missing field {name!r}")
            continue
        values[name] = _check(f.type, body[name], f"{where}.{name}")
    return cls(**values)


def _check(annotation: str, value: Any, where: str) -> Any:
    """Validate one field against its annotation (kept as a string by `from __future__ import annotations`)."""
    optional = annotation.endswith(" | None")
    kind = annotation.removesuffix(" | None")
    if value is None:
        if optional:
            return None
        raise WireError(f"{where}: must not be null")
    if kind in ("int", "float", "str", "bool"):
        scalar = {"int": int, "float": float, "str": str, "bool": bool}[kind]
        if not isinstance(value, _SCALARS[scalar]) or (scalar is not bool and isinstance(value, bool)):
            raise WireError(f"{where}: expected {kind}, got {type(value).__name__}")
        return float(value) if scalar is float else value
    if kind in ("list[int]", "list[str]"):
        item = int if kind == "list[int]" else str
        if not isinstance(value, list) or not all(isinstance(v, item) and not isinstance(v, bool) for v in value):
            raise WireError(f"{where}: expected {kind}")
        return value
    if kind in ("dict[str, Any]", "list[list[Any]]"):
        if not isinstance(value, dict if kind.startswith("dict") else list):
            raise WireError(f"{where}: expected {kind}")
        return value  # the consumer validates the contents (SamplingParams, logprob rows)
    if kind == "WorkerStats":
        return _build(WorkerStats, value, where)
    if kind == "list[TokenDelta]":
        if not isinstance(value, list):
            raise WireError(f"{where}: expected a list")
        return [_build(TokenDelta, v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise WireError(f"{where}: no rule for {annotation}")  # a programming error, caught by the wire tests


def sampling_params_to_wire(params) -> dict[str, Any]:
    """SamplingParams -> a msgpack-safe map (logit_bias keys become a list of pairs: map keys must be strings)."""
    out = dataclasses.asdict(params)
    out["logit_bias"] = [[k, v] for k, v in params.logit_bias.items()]
    out["stop_token_ids"] = list(params.stop_token_ids)
    return out


def sampling_params_from_wire(fields_: dict[str, Any]):
    """The inverse of sampling_params_to_wire; SamplingParams' own validation runs on the result."""
    from shared.sampling_params import SamplingParams

    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = set(fields_) - known
    if unknown:
        raise WireError(f"unknown sampling parameters {sorted(unknown)}")
    values = dict(fields_)
    bias = values.get("logit_bias", [])
    if not isinstance(bias, list) or not all(isinstance(p, list) and len(p) == 2 for p in bias):
        raise WireError("logit_bias must be a list of [token_id, bias] pairs")
    values["logit_bias"] = {int(k): float(v) for k, v in bias}
    try:
        return SamplingParams(**values)
    except TypeError as e:
        raise WireError(f"bad sampling parameters: {e}") from e

