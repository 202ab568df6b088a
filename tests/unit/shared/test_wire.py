"""The wire format: every message round-trips, and malformed, unknown or oversized frames are refused."""

from __future__ import annotations

import math
import typing

import msgpack
import msgspec
import pytest

from shared import wire
from shared.sampling_params import SamplingParams, SamplingParamsError

STATS = wire.WorkerStats(num_running=1, num_waiting=2, kv_blocks_total=100, kv_blocks_used=7,
                         prefix_cache_query_tokens=50, prefix_cache_hit_tokens=16, num_preemptions=0)
MESSAGES = [
    wire.AddRequest(request_id="r1", prompt_token_ids=[1, 2, 3],
                    params=wire.sampling_params_to_wire(SamplingParams(n=2, logit_bias={5: -1.5}, seed=3))),
    wire.AbortRequests(request_ids=["r1", "r2"]),
    wire.WorkerReady(model="m", architecture="Qwen3ForCausalLM", dtype="torch.float32",
                     device="cpu", attention_backend="torch", quantization="none", decode_graphs="off",
                     max_model_len=512, vocab_size=320, stats=STATS),
    wire.StepOutputs(deltas=[wire.TokenDelta(request_id="r1", index=0, token_ids=[7], finish_reason=None,
                                             num_prompt_tokens=3, num_cached_tokens=0,
                                             logprobs=[[7, -0.5, [[7, -0.5], [9, -1.25]]]], queue_time=0.01,
                                             prompt_logprobs=[[2, -1.5, 3, [[4, -0.25]]], [3, -0.75, 1, []]])],
                     stats=STATS),
    wire.Heartbeat(stats=STATS),
    wire.RequestFailed(request_id="r1", message="too long", param="prompt"),
    wire.AddRequest(request_id="r2", prompt_token_ids=[4], params=wire.WireSamplingParams(), timeout_s=2.5),
    wire.AddRequest(request_id="r3", prompt_token_ids=[4], params=wire.WireSamplingParams(), tenant="team-a",
                    tenant_weight=2.5),
    wire.DebugQuery(token="t1", what="inject_kv_fault", arg="leak"),
    wire.DebugReply(token="t1", body={"totals": {"used": 3}, "requests": {"r1": []}}, error=None),
    wire.AbortChoices(request_id="r1", indices=[0, 2]),
]
ALL = tuple(type(m) for m in MESSAGES)


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.TYPE)
def test_round_trip(message):
    assert wire.decode(wire.encode(message), ALL) == message


def test_sampling_params_round_trip():
    params = SamplingParams(n=3, max_tokens=9, temperature=0.5, top_k=4, logit_bias={11: 2.0, 3: -100.0},
                            stop_token_ids=(4, 5), seed=-7, logprobs=2, prompt_logprobs=3)
    message = wire.decode(wire.encode(wire.AddRequest("r", [1], wire.sampling_params_to_wire(params))), ALL)
    assert wire.sampling_params_from_wire(message.params) == params


def frame(body) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


GOOD_ADD = {"type": "add", "request_id": "r", "prompt_token_ids": [1, 2], "params": {}}
GOOD_DELTA = {"request_id": "r", "index": 0, "token_ids": [7], "finish_reason": None, "num_prompt_tokens": 3,
              "num_cached_tokens": 0}
STATS_MAP = {"num_running": 0, "num_waiting": 0, "kv_blocks_total": 1, "kv_blocks_used": 0,
             "prefix_cache_query_tokens": 0, "prefix_cache_hit_tokens": 0, "num_preemptions": 0}


@pytest.mark.parametrize("raw, problem", [
    (b"\xc1\xff", "not a msgpack frame"),
    (frame([1, 2]), "must be a map"),
    (frame({"type": "exec", "code": "rm -rf /"}), "unexpected message type"),
    (frame({**GOOD_ADD, "extra": 1}), "unknown fields"),
    (frame({k: v for k, v in GOOD_ADD.items() if k != "prompt_token_ids"}), "missing field"),
    (frame({**GOOD_ADD, "prompt_token_ids": [1, "2"]}), r"expected list\[int\]"),
    (frame({**GOOD_ADD, "prompt_token_ids": [True]}), r"expected list\[int\]"),
    (frame({**GOOD_ADD, "request_id": 5}), "expected str"),
    (frame({**GOOD_ADD, "params": None}), "must not be null"),
    (frame({"type": "outputs", "deltas": [{"request_id": "r"}], "stats": {}}), "missing field"),
    (frame({**GOOD_ADD, "timeout_s": "soon"}), "expected float"),
    (frame({**GOOD_ADD, "tenant": 7}), "expected str"),
    (frame({**GOOD_ADD, "tenant_weight": 0}), "must be positive"),
    (frame({**GOOD_ADD, "tenant_weight": -2.0}), "must be positive"),
    (frame({**GOOD_ADD, "tenant_weight": "heavy"}), "expected float"),
    (frame({"type": "debug_reply", "token": "t", "body": []}), r"expected dict\[str, Any\]"),
    (frame({"type": "abort_choices", "request_id": "r", "indices": ["0"]}), r"expected list\[int\]"),
    (frame({"type": "outputs", "stats": STATS_MAP, "deltas": [{**GOOD_DELTA, "prompt_logprobs": [[1, -0.5, 0, []]]}]}),
     r"rank"),  # ranks start at 1
    (frame({"type": "outputs", "stats": STATS_MAP, "deltas": [{**GOOD_DELTA, "prompt_logprobs": [[1, -0.5, [[2, -1]]]]}]}),
     r"rank"),
], ids=lambda v: v.replace(" ", "-") if isinstance(v, str) else "")
def test_malformed_frames_are_refused(raw, problem):
    with pytest.raises(wire.WireError, match=problem):
        wire.decode(raw, ALL)


def test_a_side_accepts_only_its_own_message_types():
    # A worker must not act on worker-to-gateway messages, nor the gateway on requests.
    with pytest.raises(wire.WireError, match="unexpected message type"):
        wire.decode(wire.encode(MESSAGES[2]), (wire.AddRequest, wire.AbortRequests))


def test_oversized_frame_is_refused():
    with pytest.raises(wire.WireError, match="exceeds"):
        wire.decode(b"\x00" * (wire.MAX_FRAME_BYTES + 1), ALL)


def test_bad_sampling_params_are_refused_with_their_name():
    with pytest.raises(wire.WireError, match="unknown sampling parameters"):
        wire.sampling_params_from_wire({"evil": 1})
    with pytest.raises(SamplingParamsError) as e:
        wire.sampling_params_from_wire({"temperature": 9.0})
    assert e.value.param == "temperature"


def _plain(value):
    """A message as the plain nested map msgpack would pack: a tagged message's "type" first, then its fields."""
    if isinstance(value, msgspec.Struct):
        tag = type(value).__struct_config__.tag
        fields = {name: _plain(getattr(value, name)) for name in value.__struct_fields__}
        return fields if tag is None else {"type": tag, **fields}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_encoding_is_the_plain_field_map(message):
    """A frame is the plain msgpack map of the message's fields, every field present, as msgpack itself packs it."""
    assert wire.encode(message) == msgpack.packb(_plain(message), use_bin_type=True)


SAMPLES = [0, 1, -1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), True, False, 0.0, 1.5, -2.0, float("nan"),
           float("inf"), float("-inf"), "", "x", None, [], [0, 5], [-1], [True], [1.0], [2**63], {}, [[1, -0.5, []]],
           b"x"]
ROWS = ("logprobs", "prompt_logprobs")  # positional rows, checked by shape: a logprob may be -inf


def _field_paths(body: dict, prefix=()):
    """Paths to every field of a frame's map, into nested records and the first element of their lists."""
    for key, value in body.items():
        if key == "type" or key in ROWS:
            continue
        yield (*prefix, key)
        if isinstance(value, dict) and key != "body":
            yield from _field_paths(value, (*prefix, key))
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            yield from _field_paths(value[0], (*prefix, key, 0))


def _replaced(body, path, value):
    body = list(body) if isinstance(body, list) else dict(body)
    body[path[0]] = value if len(path) == 1 else _replaced(body[path[0]], path[1:], value)
    return body


def _numbers(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(k)
            if k not in ROWS:
                yield from _numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _numbers(v)
    elif type(value) in (int, float):
        yield value


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_number_that_gets_through_is_an_int64_or_finite(message):
    """Any value of any msgpack kind in any field: what decodes carries only int64 integers and finite floats
    (msgspec takes NaN, infinities and integers up to 2**64 - 1 unless the field's bounds say otherwise)."""
    body = msgspec.to_builtins(message)
    accepted = refused = 0
    for path in _field_paths(body):
        for sample in SAMPLES:
            try:
                decoded = wire.decode(frame(_replaced(body, path, sample)), ALL)
            except wire.WireError:
                refused += 1
                continue
            accepted += 1
            for number in _numbers(msgspec.to_builtins(decoded)):
                assert (type(number) is int and -(2**63) <= number < 2**63) or math.isfinite(number), (path, sample)
    assert accepted and refused


def test_the_bounds_refuse_what_they_name():
    add = msgspec.to_builtins(MESSAGES[0])
    for field, value in [("timeout_s", float("nan")), ("timeout_s", float("inf")), ("tenant_weight", float("nan"))]:
        with pytest.raises(wire.WireError, match=f"AddRequest.{field}: must be"):
            wire.decode(frame({**add, field: value}), ALL)
    with pytest.raises(wire.WireError, match=r"AddRequest.prompt_token_ids\[1\]: out of the int64 range"):
        wire.decode(frame({**add, "prompt_token_ids": [1, 2**63]}), ALL)
    with pytest.raises(wire.WireError, match=r"AddRequest.params.seed: out of the int64 range"):
        wire.decode(frame({**add, "params": {"seed": 2**64 - 1}}), ALL)
    with pytest.raises(wire.WireError, match=r"AddRequest.params.temperature: must be finite"):
        wire.decode(frame({**add, "params": {"temperature": float("inf")}}), ALL)
    stats = {**STATS_MAP, "num_waiting": -1}
    with pytest.raises(wire.WireError, match=r"Heartbeat.stats.num_waiting: must not be negative"):
        wire.decode(frame({"type": "heartbeat", "stats": stats}), ALL)


def test_a_frame_without_a_type_is_refused_even_where_one_type_is_allowed():
    with pytest.raises(wire.WireError, match="unexpected message type"):
        wire.decode(frame({"request_ids": ["r"]}), (wire.AbortRequests,))


def test_the_wire_sampling_parameters_are_sampling_params_fields():
    """WireSamplingParams is derived from SamplingParams: the same names and defaults, in the same order."""
    import dataclasses

    assert wire.WireSamplingParams.__struct_fields__ == tuple(f.name for f in dataclasses.fields(SamplingParams))
    assert wire.sampling_params_from_wire(wire.WireSamplingParams()) == SamplingParams()
    assert typing.get_origin(typing.get_type_hints(wire.WireSamplingParams, include_extras=True)["seed"]) is not None
