"""Typed messages between the gateway and its workers, framed as MessagePack by msgspec.

Every frame is a msgpack map with a "type" (the message's tag) and the fields that type declares. The
checks come from the field types: msgspec decodes a frame straight into the message class its tag names,
refusing unknown and missing fields, values of the wrong type, and numbers outside the bounds the
annotations below carry (int64 everywhere, finite floats, non-negative counts). What types cannot say is
checked explicitly after decoding: the shape of logprob rows (`_check_rows`). A malformed frame raises
`WireError` and is never acted upon. Nothing is ever unpickled.

gateway -> worker: AddRequest, AbortRequests, AbortChoices (some choices of an n > 1 request),
                   DebugQuery (operator questions: /debug/kv)
worker -> gateway: WorkerReady, StepOutputs (token deltas and stats after every step), Heartbeat
                   (stats while idle), RequestFailed (a request the engine refused), DebugReply
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
import typing
from typing import Annotated, Any, ClassVar, Union

import msgspec

from shared.request_limits import INT64
from shared.sampling_params import SamplingParams

# A worker's exit code when it cannot serve the model as configured (an unsupported checkpoint, a setting the
# model cannot take: the engine's ValueError at construction). Restarting cannot help, so the gateway stops.
EXIT_BAD_CONFIG = 78  # sysexits.h's EX_CONFIG

# A prompt of a million token ids packs to about 5 MB; anything far beyond is not a request.
MAX_FRAME_BYTES = 64 << 20

# msgpack carries integers up to 2**64 - 1; every integer on the wire (ids, counts, seeds) fits int64.
INT64_MIN, INT64_MAX = INT64.lo, INT64.hi
_FLOAT_MAX = sys.float_info.max
Int = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]  # also token ids, choice indices
# msgspec takes NaN and infinities for a float; bounds at the largest finite float refuse them (NaN fails
# every comparison). An int arriving for a float field becomes a float.
Float = Annotated[float, msgspec.Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=_FLOAT_MAX)]
Weight = Annotated[float, msgspec.Meta(gt=0, le=_FLOAT_MAX)]


class WireError(ValueError):
    """A frame that is not a valid message. `request_id` is set when the frame was an AddRequest whose id
    could still be read, so the worker can refuse that request instead of leaving it unanswered."""

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.request_id = request_id


class _Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A record on the wire: immutable, and a field it does not declare refuses the frame."""


class _Message(_Record, frozen=True, tag_field="type"):
    """A whole frame; its class's tag (TYPE) is the frame's "type"."""

    TYPE: ClassVar[str]


def _sampling_wire_type(hint: Any) -> Any:
    """SamplingParams' annotation as the wire checks it: every int an int64, every float finite."""
    if hint is int:
        return Int
    if hint is float:
        return Float
    args = tuple(_sampling_wire_type(a) for a in typing.get_args(hint))
    origin = typing.get_origin(hint)
    if origin in (Union, type(int | None)):
        return Union[args]
    if origin is tuple:  # tuple[int, ...]
        return tuple[args[0], ...]
    if origin is dict:
        return dict[args]
    return hint  # bool, str, None


def _sampling_field(f: dataclasses.Field) -> tuple:
    if f.default_factory is not dataclasses.MISSING:
        return f.name, _sampling_wire_type(_SAMPLING_HINTS[f.name]), msgspec.field(default_factory=f.default_factory)
    return f.name, _sampling_wire_type(_SAMPLING_HINTS[f.name]), f.default


# SamplingParams' fields, typed for the wire and derived from the dataclass so the two never drift apart.
# The worker builds SamplingParams from it (sampling_params_from_wire), whose own checks then run: the
# wire refuses what is not well-typed, SamplingParams what is out of its range, naming the parameter.
_SAMPLING_HINTS = typing.get_type_hints(SamplingParams)
WireSamplingParams = msgspec.defstruct("WireSamplingParams",
                                       [_sampling_field(f) for f in dataclasses.fields(SamplingParams)],
                                       bases=(_Record,), frozen=True, module=__name__)


class WorkerStats(_Record, frozen=True):
    num_running: Count  # sequences
    num_waiting: Count
    kv_blocks_total: Count
    kv_blocks_used: Count  # held by live sequences; unreferenced cached blocks do not count
    prefix_cache_query_tokens: Count  # cumulative since the worker started
    prefix_cache_hit_tokens: Count
    num_preemptions: Count
    kv_invariant_violations: Count = 0  # cumulative: audits that found broken block accounting (and repaired it)
    # Speculative decoding, cumulative (worker/spec/acceptance.py:SpecCounters): drafts verified, their tokens,
    # the accepted ones, accepted drafts per position (index i: position i), drafts by accepted count.
    spec_num_drafts: Count = 0
    spec_num_draft_tokens: Count = 0
    spec_num_accepted_tokens: Count = 0
    spec_accepted_per_position: list[Count] = msgspec.field(default_factory=list)
    spec_acceptance_histogram: list[Count] = msgspec.field(default_factory=list)


class AddRequest(_Message, frozen=True, tag="add"):
    request_id: str
    prompt_token_ids: list[Count]
    params: WireSamplingParams  # the worker builds (and so validates) SamplingParams from it
    # Seconds the request may still take, queue included (its deadline; monotonic clocks differ across
    # processes, so the budget travels, not the time). None: no deadline.
    timeout_s: Float | None = None
    # Who sent it (an API key's name, never the key; "" without keys) and that key's weight: the worker
    # admits weighted-fair between tenants.
    tenant: str = ""
    tenant_weight: Weight = 1.0


class AbortRequests(_Message, frozen=True, tag="abort"):
    request_ids: list[str]


class AbortChoices(_Message, frozen=True, tag="abort_choices"):
    """Stop some choices of one request (each ended on a stop string in the gateway); the others run on."""

    request_id: str
    indices: list[Count]


class WorkerReady(_Message, frozen=True, tag="ready"):
    model: str
    architecture: str
    dtype: str
    device: str  # the torch device the engine runs on, e.g. "cpu", "cuda:0"
    attention_backend: str
    quantization: str
    decode_graphs: str  # "on (...)" or "off (reason)": whether decode steps replay CUDA graphs
    max_model_len: Count
    vocab_size: Count
    stats: WorkerStats
    speculative_decoding: str = "off"  # or the method and its settings (shared/speculative_config.py)
    # How the quantized kernels quantize activations (int8x2, int8), or "none" without quantized weights.
    activation_quantization: str = "none"
    # What runs a layer's operators around its matmuls and attention: "mojo" (the CPU's fused kernels), "compiled"
    # (torch.compile's fused kernels, CUDA) or "torch" (one operator at a time).
    layer_ops: str = "torch"


# One sampled token's logprob entry: [token_id, logprob, [[token_id, logprob], ...]] (the top alternatives).
# One scored prompt token: [token_id, logprob, rank, [[token_id, logprob], ...]].
# Positional rows, which the engine builds and the gateway reads as lists: typed as tuples, msgspec would
# hand back tuples, so their shape is checked by `_check_rows` instead.
LogprobRow = list[Any]
PromptLogprobRow = list[Any]


class TokenDelta(_Record, frozen=True):
    """New tokens of one choice. logprobs, when asked for: one [token_id, logprob, [[id, logprob], ...]]
    per new token. prompt_logprobs, when asked for, once per request (on choice 0's first delta): one
    [token_id, logprob, rank, [[id, logprob], ...]] per prompt token after the first."""

    request_id: str
    index: Count
    token_ids: list[Count]
    finish_reason: str | None
    num_prompt_tokens: Count
    num_cached_tokens: Count
    logprobs: list[LogprobRow] | None = None
    stop_token_id: Int | None = None  # on a finishing delta: the stop token (EOS or stop_token_ids) it ends with
    queue_time: Seconds | None = None  # seconds waited before first scheduled, on a choice's first delta
    prompt_logprobs: list[PromptLogprobRow] | None = None
    # A pooling request's result (--task embed|score), on its finishing delta: the embedding, or [score].
    pooled: list[Float] | None = None


class StepOutputs(_Message, frozen=True, tag="outputs"):
    deltas: list[TokenDelta]
    stats: WorkerStats


class Heartbeat(_Message, frozen=True, tag="heartbeat"):
    stats: WorkerStats


class RequestFailed(_Message, frozen=True, tag="failed"):
    request_id: str
    message: str
    param: str | None = None


KV_FAULT_KINDS = ("leak", "orphan", "over_free")  # what inject_kv_fault can break (worker/core/kv_audit.py)


class DebugQuery(_Message, frozen=True, tag="debug_query"):
    """An operator's question to a worker, answered between two engine steps by a DebugReply with the same
    token. what: "kv_ledger" (arg unused) or "inject_kv_fault" (arg: the fault kind; refused unless the
    worker runs with --enable-debug-faults)."""

    token: str
    what: str
    arg: str | None = None


class DebugReply(_Message, frozen=True, tag="debug_reply"):
    token: str
    body: dict[str, Any]
    error: str | None = None


MESSAGE_TYPES = {cls.__struct_config__.tag: cls for cls in (AddRequest, AbortRequests, WorkerReady, StepOutputs,
                                                            Heartbeat, RequestFailed, AbortChoices, DebugQuery,
                                                            DebugReply)}
for _tag, _cls in MESSAGE_TYPES.items():
    _cls.TYPE = _tag
Message = (AddRequest | AbortRequests | WorkerReady | StepOutputs | Heartbeat | RequestFailed | AbortChoices
           | DebugQuery | DebugReply)

_encoder = msgspec.msgpack.Encoder()


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


class _Untagged(_Message, frozen=True, tag="\0"):
    """Never sent: a decoder for one message type still needs a union, or msgspec would take a frame
    without a "type" as that type."""


@functools.cache
def _decoder(allowed: tuple[type, ...]) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(Union[(*allowed, _Untagged)])


def decode(frame: bytes, allowed: tuple[type, ...]) -> Message:
    """Parse and validate one frame; only the message classes in `allowed` are accepted."""
    if len(frame) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        message = _decoder(allowed).decode(frame)
    except msgspec.ValidationError as e:
        raise _refusal(frame, allowed, str(e)) from None
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError) as e:  # corrupt input, or nested too deep
        raise WireError(f"not a msgpack frame: {e}") from e
    if type(message) is StepOutputs:
        for i, delta in enumerate(message.deltas):
            if delta.logprobs is not None or delta.prompt_logprobs is not None:
                _check_rows(delta, f"StepOutputs.deltas[{i}]")
    elif type(message) is _Untagged:
        raise WireError("unexpected message type '\\x00'")
    return message


def _check_rows(delta: TokenDelta, where: str) -> None:
    if delta.logprobs is not None and not all(map(_is_logprob_row, delta.logprobs)):
        raise WireError(f"{where}.logprobs: expected [token_id, logprob, [[token_id, logprob], ...]] rows")
    if delta.prompt_logprobs is not None and not all(map(_is_prompt_logprob_row, delta.prompt_logprobs)):
        raise WireError(f"{where}.prompt_logprobs: expected [token_id, logprob, rank, [[token_id, logprob], ...]] rows")


def _is_token_id(value: Any) -> bool:
    return type(value) is int and 0 <= value <= INT64_MAX


def _is_logprob(value: Any) -> bool:
    return type(value) in (float, int) and not math.isnan(value)  # -inf is a logprob; NaN is none


def _is_logprob_row(row: Any) -> bool:
    return (type(row) is list and len(row) == 3 and _is_token_id(row[0]) and _is_logprob(row[1])
            and type(row[2]) is list and all(type(p) is list and len(p) == 2 and _is_token_id(p[0])
                                             and _is_logprob(p[1]) for p in row[2]))


def _is_prompt_logprob_row(row: Any) -> bool:
    return (type(row) is list and len(row) == 4 and type(row[2]) is int and 1 <= row[2] <= INT64_MAX
            and _is_logprob_row([row[0], row[1], row[3]]))


def sampling_params_to_wire(params: SamplingParams) -> WireSamplingParams:
    return WireSamplingParams(**{f: getattr(params, f) for f in WireSamplingParams.__struct_fields__})


def sampling_params_from_wire(params: WireSamplingParams | dict[str, Any]) -> SamplingParams:
    """SamplingParams from their wire form (or a map of its fields, checked as a frame's would be);
    SamplingParams' own validation runs on the result and names the parameter it refuses."""
    if isinstance(params, dict):
        unknown = params.keys() - set(WireSamplingParams.__struct_fields__)
        if unknown:
            raise WireError(f"unknown sampling parameters {sorted(map(str, unknown))}")
        try:
            params = msgspec.convert(params, WireSamplingParams, strict=True)
        except msgspec.ValidationError as e:
            raise WireError(f"bad sampling parameters: {_explain(WireSamplingParams, str(e))}") from None
    try:
        return SamplingParams(**msgspec.structs.asdict(params))
    except (TypeError, OverflowError) as e:
        raise WireError(f"bad sampling parameters: {e}") from e


# ----- the error path: msgspec's reasons, said in the wire's words (the first field that failed) -----

def _refusal(frame: bytes, allowed: tuple[type, ...], reason: str) -> WireError:
    try:  # untyped, only to name the message and its request
        body = msgspec.msgpack.decode(frame)
    except Exception:  # e.g. a map key that cannot be a Python key, which the typed pass stopped before
        return WireError(reason)
    if not isinstance(body, dict):
        return WireError("a frame must be a map")
    kind = body.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None or cls not in allowed:
        return WireError(f"unexpected message type {kind!r}")
    request_id = body.get("request_id") if cls is AddRequest else None
    return WireError(_explain(cls, reason), request_id if isinstance(request_id, str) else None)


def _explain(cls: type, reason: str) -> str:
    """msgspec's "Expected `int` >= 0 - at `$.deltas[0].index`" as "StepOutputs.deltas[0].index: must not be
    negative"; a type mismatch names the declared type of the field it happened in."""
    text, _, at = reason.partition(" - at `")
    key, _, path = at.rstrip("`").rpartition("$")  # key: "`key` in `" when a map's key was the problem
    where = cls.__name__ + path + (" (a key)" if key else "")
    if text.startswith("Object missing required field "):
        return f"{where}: missing field {text.rpartition(' ')[2].strip('`')!r}"
    if text.startswith("Object contains unknown field "):
        return f"{where}: unknown fields [{text.rpartition(' ')[2].strip('`')!r}]"
    if text.startswith("Expected `") and ", got `" in text:
        got = text.rpartition("got ")[2].strip("`")
        if got in ("null", "None"):
            return f"{where}: must not be null"
        expected = text.split("`")[1] if key else _type_name(_field_type(cls, path))
        return f"{where}: expected {expected}, got {got}"
    op, bound = text.rsplit(" ", 2)[-2:]
    if text.startswith("Expected `") and op in ("<", "<=", ">", ">="):  # a bound: "Expected `float` > 0.0"
        if bound in (str(INT64_MIN), str(INT64_MAX)):
            return f"{where}: out of the int64 range"
        if abs(float(bound)) == _FLOAT_MAX:
            return f"{where}: must be finite"
        if float(bound) == 0:
            return f"{where}: must be positive" if op == ">" else f"{where}: must not be negative"
        return f"{where}: must be {op} {bound}"
    return f"{where}: {text}"


def _field_type(cls: type, path: str) -> Any:
    """The annotation of the innermost record field `path` ("$.deltas[0].token_ids[2]" less the "$") names."""
    tp = found = cls
    for part in path.replace("[", ".[").split(".")[1:]:
        tp = _strip(tp)
        if part.startswith("["):
            args = typing.get_args(tp)
            tp = args[-1] if args else Any
        elif isinstance(tp, type) and issubclass(tp, msgspec.Struct):
            tp = found = typing.get_type_hints(tp, include_extras=True).get(part, Any)
        else:
            break
    return found


def _strip(tp: Any) -> Any:
    """Int | None -> int: the annotation without its bounds and its None."""
    if typing.get_origin(tp) is Annotated:
        return _strip(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (Union, type(int | None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _strip(args[0]) if len(args) == 1 else tp
    return tp


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Annotated:
        return _type_name(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (Union, type(int | None)):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    args = typing.get_args(tp)
    if args:
        return f"{typing.get_origin(tp).__name__}[{', '.join('...' if a is ... else _type_name(a) for a in args)}]"
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp)).removeprefix("typing.")
