"""Typed messages between the gateway and its workers, and their msgpack framing.

Every frame is a msgpack map with a "type" and the fields that type declares. `decode` checks the frame
size, the type, every field's presence and type, and refuses anything it does not know, so a malformed
frame raises `WireError` and is never acted upon. Nothing is ever unpickled.

gateway -> worker: AddRequest, AbortRequests, AbortChoices (some choices of an n > 1 request),
                   DebugQuery (operator questions: /debug/kv)
worker -> gateway: WorkerReady, StepOutputs (token deltas and stats after every step), Heartbeat
                   (stats while idle), RequestFailed (a request the engine refused), DebugReply
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import msgpack

# A prompt of a million token ids packs to about 5 MB; anything far beyond is not a request.
MAX_FRAME_BYTES = 64 << 20


class WireError(ValueError):
    """A frame that is not a valid message. `request_id` is set when the frame was an AddRequest whose id
    could still be read, so the worker can refuse that request instead of leaving it unanswered."""

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.request_id = request_id


@dataclass(frozen=True)
class WorkerStats:
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("num_running", "num_waiting", "kv_blocks_total", "kv_blocks_used",
                                               "prefix_cache_query_tokens", "prefix_cache_hit_tokens",
                                               "num_preemptions", "kv_invariant_violations")
    num_running: int
    num_waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    prefix_cache_query_tokens: int  # cumulative since the worker started
    prefix_cache_hit_tokens: int
    num_preemptions: int
    kv_invariant_violations: int = 0  # cumulative


@dataclass(frozen=True)
class AddRequest:
    TYPE: ClassVar[str] = "add"
    POSITIVE: ClassVar[tuple[str, ...]] = ("tenant_weight",)
    request_id: str
    prompt_token_ids: list[int]
    params: dict[str, Any]  # SamplingParams fields; the worker builds (and so validates) SamplingParams
    # Seconds the request may still take, queue included (its deadline; monotonic clocks differ across
    # processes, so the budget travels, not the time). None: no deadline.
    timeout_s: float | None = None
    # Who sent it (an API key's name, never the key; "" without keys) and that key's weight: the worker
    # admits weighted-fair between tenants.
    tenant: str = ""
    tenant_weight: float = 1.0


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
    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("max_model_len", "vocab_size")
    model: str
    architecture: str
    dtype: str
    device: str  # the torch device the engine runs on, e.g. "cpu", "cuda:0"
    attention_backend: str
    quantization: str
    decode_graphs: str  # "on (...)" or "off (reason)": whether decode steps replay CUDA graphs
    max_model_len: int
    vocab_size: int
    stats: WorkerStats


# One sampled token's logprob entry: [token_id, logprob, [[token_id, logprob], ...]] (the top alternatives).
LogprobRow = list[Any]
# One scored prompt token: [token_id, logprob, rank, [[token_id, logprob], ...]].
PromptLogprobRow = list[Any]


@dataclass(frozen=True)
class TokenDelta:
    """New tokens of one choice. logprobs, when asked for: one [token_id, logprob, [[id, logprob], ...]]
    per new token. prompt_logprobs, when asked for, once per request (on choice 0's first delta): one
    [token_id, logprob, rank, [[id, logprob], ...]] per prompt token after the first."""

    NON_NEGATIVE: ClassVar[tuple[str, ...]] = ("index", "num_prompt_tokens", "num_cached_tokens", "queue_time")
    request_id: str
    index: int
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list[LogprobRow] | None = None
    stop_token_id: int | None = None
    queue_time: float | None = None  # seconds waited before first scheduled, on a choice's first delta
    prompt_logprobs: list[PromptLogprobRow] | None = None


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


KV_FAULT_KINDS = ("leak", "orphan", "over_free")  # what inject_kv_fault can break (worker/core/kv_audit.py)


@dataclass(frozen=True)
class DebugQuery:
    """An operator's question to a worker, answered between two engine steps by a DebugReply with the same
    token. what: "kv_ledger" (arg unused) or "inject_kv_fault" (arg: the fault kind; refused unless the
    worker runs with --enable-debug-faults)."""

    TYPE: ClassVar[str] = "debug_query"
    token: str
    what: str
    arg: str | None = None


@dataclass(frozen=True)
class DebugReply:
    TYPE: ClassVar[str] = "debug_reply"
    token: str
    body: dict[str, Any]
    error: str | None = None


MESSAGE_TYPES = {cls.TYPE: cls for cls in (AddRequest, AbortRequests, WorkerReady, StepOutputs, Heartbeat,
                                           RequestFailed, AbortChoices, DebugQuery, DebugReply)}
Message = (AddRequest | AbortRequests | WorkerReady | StepOutputs | Heartbeat | RequestFailed | AbortChoices
           | DebugQuery | DebugReply)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _as_map(obj: Any) -> dict[str, Any]:
    """A message (or a message inside one) as a map of its fields; msgpack calls this for each nested one,
    so nothing is deep-copied first as dataclasses.asdict would (a step's deltas are most of the traffic)."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise TypeError(f"cannot put a {type(obj).__name__} on the wire")
    return {name: getattr(obj, name) for name in _field_names(type(obj))}


def encode(message: Message) -> bytes:
    body = _as_map(message)
    body["type"] = message.TYPE
    return msgpack.packb(body, use_bin_type=True, default=_as_map)


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
    kind = body.pop("type", None)
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None or cls not in allowed:
        raise WireError(f"unexpected message type {kind!r}")
    try:
        return _build(cls, body, cls.__name__)
    except WireError as e:
        request_id = body.get("request_id") if cls is AddRequest else None
        if isinstance(request_id, str):
            e.request_id = request_id
        raise


_SCALARS = {int: (int,), float: (float, int), str: (str,), bool: (bool,)}
# msgpack carries integers up to 2**64 - 1; every integer on the wire (ids, counts, seeds) fits int64.
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1


def _is_int64(value: Any) -> bool:
    return type(value) is int and _INT_MIN <= value <= _INT_MAX


def _is_finite_float(value: Any) -> bool:
    return type(value) is float and math.isfinite(value)


# Per annotation, a test that a value is valid as it stands (no conversion due), true for the common case
# only; a value it does not pass goes through `_check`, which converts it or says precisely what is wrong.
# This keeps the error path's messages out of the path every token delta takes.
_VALID_AS_IS: dict[str, Any] = {
    "int": _is_int64,
    "int | None": lambda v: v is None or _is_int64(v),
    "float": _is_finite_float,
    "float | None": lambda v: v is None or _is_finite_float(v),
    "str": lambda v: type(v) is str,
    "str | None": lambda v: v is None or type(v) is str,
    "list[int]": lambda v: type(v) is list and all(type(t) is int and 0 <= t <= _INT_MAX for t in v),
    "list[LogprobRow] | None": lambda v: v is None,
    "list[PromptLogprobRow] | None": lambda v: v is None,
}


@dataclass(frozen=True)
class _Plan:
    """How to check one message class, worked out once: its fields (name, annotation, quick test, required)."""

    names: frozenset[str]
    fields: tuple[tuple[str, str, Any, bool], ...]
    non_negative: tuple[str, ...]
    positive: tuple[str, ...]


@functools.cache
def _plan(cls: type) -> _Plan:
    fields = tuple((f.name, f.type, _VALID_AS_IS.get(f.type),
                    f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                   for f in dataclasses.fields(cls))
    return _Plan(frozenset(f[0] for f in fields), fields, getattr(cls, "NON_NEGATIVE", ()),
                 getattr(cls, "POSITIVE", ()))


def _build(cls: type, body: Any, where: str) -> Any:
    if not isinstance(body, dict):
        raise WireError(f"{where}: expected a map")
    plan = _plan(cls)
    unknown = body.keys() - plan.names
    if unknown:
        raise WireError(f"{where}: unknown fields {sorted(unknown)}")
    values = {}
    for name, annotation, valid_as_is, required in plan.fields:
        if name not in body:
            if required:
                raise WireError(f"{where}: missing field {name!r}")
            continue
        value = body[name]
        values[name] = value if valid_as_is is not None and valid_as_is(value) else \
            _check(annotation, value, f"{where}.{name}")
    for name in plan.non_negative:
        if values.get(name) is not None and values[name] < 0:
            raise WireError(f"{where}.{name}: must not be negative, got {values[name]}")
    for name in plan.positive:
        if values.get(name) is not None and not values[name] > 0:
            raise WireError(f"{where}.{name}: must be positive, got {values[name]}")
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
        if scalar is int and not _INT_MIN <= value <= _INT_MAX:
            raise WireError(f"{where}: {value} is out of the int64 range")
        if scalar is float:
            value = float(value)
            if not math.isfinite(value):
                raise WireError(f"{where}: must be finite, got {value}")
        return value
    if kind == "list[int]":  # token ids
        if not isinstance(value, list) or not all(type(v) is int and 0 <= v <= _INT_MAX for v in value):
            raise WireError(f"{where}: expected {kind} of token ids (non-negative int64)")
        return value
    if kind == "list[str]":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise WireError(f"{where}: expected {kind}")
        return value
    if kind in ("dict[str, Any]", "list[list[Any]]"):
        if not isinstance(value, dict if kind.startswith("dict") else list):
            raise WireError(f"{where}: expected {kind}")
        return value  # the consumer validates the contents (SamplingParams, logprob rows)
    if kind == "list[LogprobRow]":
        if not isinstance(value, list) or not all(_is_logprob_row(row) for row in value):
            raise WireError(f"{where}: expected [token_id, logprob, [[token_id, logprob], ...]] rows")
        return value
    if kind == "list[PromptLogprobRow]":
        if not isinstance(value, list) or not all(_is_prompt_logprob_row(row) for row in value):
            raise WireError(f"{where}: expected [token_id, logprob, rank, [[token_id, logprob], ...]] rows")
        return value
    if kind == "WorkerStats":
        return _build(WorkerStats, value, where)
    if kind == "list[TokenDelta]":
        if not isinstance(value, list):
            raise WireError(f"{where}: expected a list")
        return [_build(TokenDelta, v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise WireError(f"{where}: no rule for {annotation}")  # a programming error, caught by the wire tests


def _is_token_id(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _INT_MAX


def _is_logprob(value: Any) -> bool:
    return type(value) in (float, int) and not math.isnan(value)  # -inf is a logprob; NaN is none


def _is_logprob_row(row: Any) -> bool:
    return (isinstance(row, list) and len(row) == 3 and _is_token_id(row[0]) and _is_logprob(row[1])
            and isinstance(row[2], list) and all(isinstance(p, list) and len(p) == 2 and _is_token_id(p[0])
                                                 and _is_logprob(p[1]) for p in row[2]))


def _is_prompt_logprob_row(row: Any) -> bool:
    return (isinstance(row, list) and len(row) == 4 and type(row[2]) is int and row[2] >= 1
            and _is_logprob_row([row[0], row[1], row[3]]))


def sampling_params_to_wire(params) -> dict[str, Any]:
    """SamplingParams -> a msgpack-safe map (logit_bias keys become a list of pairs: map keys must be strings)."""
    out = dataclasses.asdict(params)
    out["logit_bias"] = [[k, v] for k, v in params.logit_bias.items()]
    out["stop_token_ids"] = list(params.stop_token_ids)
    return out


def sampling_params_from_wire(fields_: dict[str, Any]):
    """The inverse of sampling_params_to_wire; SamplingParams' own validation runs on the result.

    Every field's type is checked against SamplingParams' annotation first (so its range checks never
    meet a string or a nested map); a field whose annotation has no rule here is left to SamplingParams.
    """
    from shared.sampling_params import SamplingParams

    fields = {f.name: f for f in dataclasses.fields(SamplingParams)}
    unknown = set(fields_) - set(fields)
    if unknown:
        raise WireError(f"unknown sampling parameters {sorted(unknown)}")
    values = {}
    for name, value in fields_.items():
        annotation = fields[name].type
        if name == "logit_bias":
            if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
                raise WireError("logit_bias must be a list of [token_id, bias] pairs")
            value = {_check("int", k, "logit_bias key"): _check("float", v, "logit_bias value") for k, v in value}
        elif annotation == "tuple[int, ...]":
            value = tuple(_check("list[int]", value, f"SamplingParams.{name}"))
        elif annotation.removesuffix(" | None") in ("int", "float", "str", "bool"):
            value = _check(annotation, value, f"SamplingParams.{name}")
        values[name] = value
    try:
        return SamplingParams(**values)
    except (TypeError, OverflowError) as e:
        raise WireError(f"bad sampling parameters: {e}") from e

