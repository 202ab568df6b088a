"""Fuzzed worker-link frames: random bytes, truncated and bit-flipped valid frames, and valid frames with
fields removed, added or replaced by values of the wrong type or range (nested maps and lists included)."""

from __future__ import annotations

import random
from typing import Any

import msgpack
import msgspec

from shared import wire
from shared.sampling_params import SamplingParams

STATS = wire.WorkerStats(num_running=1, num_waiting=2, kv_blocks_total=100, kv_blocks_used=7,
                         prefix_cache_query_tokens=50, prefix_cache_hit_tokens=16, num_preemptions=0)

# Values of every msgpack type, and of every range a field might not expect.
ODD_VALUES: list[Any] = [None, True, False, 0, -1, 1, 7, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, 0.5, -3.25,
                         float("nan"), float("inf"), -0.0, 1e308, "", "x", "add", "\x00\ufffd", b"", b"\xff\x00",
                         [], [1, -2], [2**64 - 1], ["a"], [[1, 2]], [[1, "x"]], [None], {}, {"k": 1},
                         {"num_running": -1}, {"": None}]


def gateway_to_worker_templates() -> list[dict]:
    params = wire.sampling_params_to_wire(SamplingParams(n=2, max_tokens=4, temperature=0.7, top_k=5,
                                                         logit_bias={5: -1.5}, stop_token_ids=(3,), seed=11,
                                                         logprobs=2))
    messages = [wire.AddRequest(request_id="fuzz-1", prompt_token_ids=[1, 2, 3], params=params,
                                tenant="team-a", tenant_weight=2.0),
                wire.AbortRequests(request_ids=["fuzz-1", "fuzz-2"])]
    return [_body(m) for m in messages]


def worker_to_gateway_templates() -> list[dict]:
    messages = [
        wire.WorkerReady(model="m", architecture="Qwen3ForCausalLM", dtype="float32",
                         device="cpu", attention_backend="torch", quantization="none", decode_graphs="off",
                         max_model_len=8, vocab_size=3, stats=STATS),
        wire.StepOutputs(deltas=[wire.TokenDelta(request_id="fuzz-1", index=0, token_ids=[7], finish_reason=None,
                                                 num_prompt_tokens=3, num_cached_tokens=0,
                                                 logprobs=[[7, -0.5, [[7, -0.5], [9, -1.25]]]], queue_time=0.01)],
                         stats=STATS),
        wire.Heartbeat(stats=STATS),
        wire.RequestFailed(request_id="fuzz-1", message="too long", param="prompt"),
    ]
    return [_body(m) for m in messages]


def _body(message) -> dict:
    return msgspec.to_builtins(message)  # the frame's map, "type" included


def _pack(body: Any) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _mutate(rng: random.Random, value: Any, depth: int = 0) -> Any:
    """A copy of `value` with one change somewhere inside it."""
    if isinstance(value, dict) and value and rng.random() < 0.85:
        value = dict(value)
        key = rng.choice(list(value))
        action = rng.random()
        if action < 0.15:
            del value[key]
        elif action < 0.25:
            value[rng.choice(["extra", "type", "evil", f"{key}_"])] = rng.choice(ODD_VALUES)
        elif action < 0.6 and depth < 4:
            value[key] = _mutate(rng, value[key], depth + 1)
        else:
            value[key] = rng.choice(ODD_VALUES)
        return value
    if isinstance(value, list) and value and rng.random() < 0.85:
        value = list(value)
        i = rng.randrange(len(value))
        if rng.random() < 0.5 and depth < 4:
            value[i] = _mutate(rng, value[i], depth + 1)
        else:
            value[i] = rng.choice(ODD_VALUES)
        return value
    return rng.choice(ODD_VALUES)


def fuzz_frames(rng: random.Random, templates: list[dict], count: int) -> list[tuple[str, bytes]]:
    """`count` (kind, frame) pairs; most are invalid, some happen to be valid messages."""
    frames = []
    for _ in range(count):
        template = rng.choice(templates)
        kind = rng.choice(["random", "truncated", "bitflip", "mutated", "mutated", "mutated", "not_a_map"])
        if kind == "random":
            frame = rng.randbytes(rng.randrange(0, 200))
        elif kind == "truncated":
            packed = _pack(template)
            frame = packed[:rng.randrange(len(packed))]
        elif kind == "bitflip":
            frame = bytearray(_pack(template))
            for _ in range(rng.randrange(1, 4)):
                frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
            frame = bytes(frame)
        elif kind == "mutated":
            body = template
            for _ in range(rng.randrange(1, 4)):
                body = _mutate(rng, body)
            frame = _pack(body)
        else:
            frame = _pack(rng.choice([[template], "add", 5, None, [1, 2, 3]]))
        frames.append((kind, frame))
    return frames


def delta_frames(rng: random.Random, count: int) -> list[bytes]:
    """StepOutputs whose one delta keeps the template's request id and has other fields broken, so they
    reach a live request named like the template's."""
    template = worker_to_gateway_templates()[1]
    frames = []
    for _ in range(count):
        delta = dict(template["deltas"][0])
        for _ in range(rng.randrange(1, 3)):
            field = rng.choice([k for k in delta if k != "request_id"])
            delta[field] = _mutate(rng, delta[field]) if rng.random() < 0.7 else rng.choice(ODD_VALUES)
        frames.append(_pack({**template, "deltas": [delta]}))
    return frames


def params_frames(rng: random.Random, count: int) -> list[bytes]:
    """AddRequests with one or two sampling parameters replaced by odd values: the frame refuses what is
    ill-typed, and what is well-typed reaches SamplingParams' own range checks."""
    template = gateway_to_worker_templates()[0]
    frames = []
    for _ in range(count):
        params = dict(template["params"])
        for _ in range(rng.randrange(1, 3)):
            params[rng.choice(list(params))] = rng.choice(ODD_VALUES)
        frames.append(_pack({**template, "params": params}))
    return frames


def oversized_frame() -> bytes:
    """A well-formed frame just over the size limit."""
    return _pack({"type": "add", "request_id": "huge", "prompt_token_ids": b"\0" * wire.MAX_FRAME_BYTES,
                  "params": {}})
