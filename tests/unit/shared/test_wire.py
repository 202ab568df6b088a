"""The wire format: every message round-trips, and malformed, unknown or oversized frames are refused."""

from __future__ import annotations

import dataclasses

import msgpack
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
    wire.AddRequest(request_id="r2", prompt_token_ids=[4], params={}, timeout_s=2.5),
    wire.AddRequest(request_id="r3", prompt_token_ids=[4], params={}, tenant="team-a", tenant_weight=2.5),
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


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_encoding_is_the_plain_field_map(message):
    """encode's shallow field maps give the bytes of the plain deep copy (dataclasses.asdict) they replaced."""
    plain = {**dataclasses.asdict(message), "type": message.TYPE}
    assert wire.encode(message) == msgpack.packb(plain, use_bin_type=True)


SAMPLES = [0, 1, -1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, True, False, 0.0, 1.5, -2.0, float("nan"),
           float("inf"), "", "x", None, [], [0, 5], [-1], [True], [1.0], [2**63], {}, [[1, -0.5, []]], b"x"]


@pytest.mark.parametrize("annotation", sorted(wire._VALID_AS_IS))
def test_the_quick_check_accepts_only_what_the_full_check_keeps_unchanged(annotation):
    """_build takes a value past `_check` when the annotation's quick test passes: that test must never pass
    a value `_check` would refuse or convert (an int for a float field goes the full way and becomes a float)."""
    quick = wire._VALID_AS_IS[annotation]
    passed = 0
    for value in SAMPLES:
        if quick(value):
            passed += 1
            assert wire._check(annotation, value, "x") is value, (annotation, value)
    assert passed  # each quick test takes some common case


def test_every_quick_check_names_an_annotation_on_the_wire():
    used = {f.type for cls in wire.MESSAGE_TYPES.values() for f in dataclasses.fields(cls)}
    used |= {f.type for cls in (wire.TokenDelta, wire.WorkerStats) for f in dataclasses.fields(cls)}
    assert set(wire._VALID_AS_IS) <= used
