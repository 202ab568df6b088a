"""Fuzzing the worker link's frames in-process (a fixed count per run, fresh seed each run): whatever
arrives, decoding either refuses it with WireError or yields a message that is well-typed all the way
down, and the side that receives it acts on it without raising (the worker's parameter checks; the
gateway's dispatch and the text handling of whatever deltas reach a request)."""

from __future__ import annotations

import random

import msgspec
import pytest

from gateway.streams.choice_stream import TextOptions, _Choice
from gateway.workers.link import RequestHandle
from gateway.workers.pool import WorkerPool
from shared import wire
from shared.config import EngineConfig
from shared.sampling_params import SamplingParams, SamplingParamsError
from tests.helpers.toy_tokenizers import default_tokenizer
from tests.helpers.wire_fuzz import (delta_frames, fuzz_frames, gateway_to_worker_templates, oversized_frame,
                                     params_frames, worker_to_gateway_templates)

FRAMES = 4000
TO_WORKER = (wire.AddRequest, wire.AbortRequests)
TO_GATEWAY = (wire.WorkerReady, wire.StepOutputs, wire.Heartbeat, wire.RequestFailed)


def _decode_all(frames, allowed):
    accepted, refused = [], 0
    for kind, frame in frames:
        try:
            message = wire.decode(frame, allowed)
        except wire.WireError:
            refused += 1
            continue
        encoded = wire.encode(message)  # well-typed all the way down: it round-trips
        assert wire.encode(wire.decode(encoded, allowed)) == encoded, kind
        accepted.append(message)
    return accepted, refused


def test_frames_to_the_worker(test_seed):
    rng = random.Random(test_seed)
    frames = fuzz_frames(rng, gateway_to_worker_templates(), FRAMES)
    frames += [("params", frame) for frame in params_frames(rng, FRAMES // 4)]
    accepted, refused = _decode_all(frames, TO_WORKER)
    params_ok = params_refused = 0
    for message in accepted:
        if isinstance(message, wire.AddRequest):
            assert all(0 <= t < 2**63 for t in message.prompt_token_ids)
            assert isinstance(message.tenant, str) and 0 < message.tenant_weight < float("inf")
            try:
                assert isinstance(wire.sampling_params_from_wire(message.params), SamplingParams)
                params_ok += 1
            except (wire.WireError, SamplingParamsError):
                params_refused += 1
    print(f"{len(frames)} frames: {refused} refused, {len(accepted)} accepted "
          f"({params_ok} with valid sampling parameters, {params_refused} refused by their checks)")
    # The fuzz reaches every layer: the parser, the message schema and the parameter checks.
    assert refused > FRAMES // 2 and params_ok > 0 and params_refused > 0


def test_frames_to_the_gateway(test_seed):
    rng = random.Random(test_seed)
    frames = fuzz_frames(rng, worker_to_gateway_templates(), FRAMES)
    frames += [("delta", frame) for frame in delta_frames(rng, FRAMES // 4)]
    accepted, refused = _decode_all(frames, TO_GATEWAY)
    for message in accepted:
        for stats in [getattr(message, "stats", None)]:
            counts = [] if stats is None else msgspec.structs.astuple(stats)
            # Counts, and lists of counts (speculative decoding's per-position and histogram counts).
            assert all(c >= 0 for v in counts for c in (v if isinstance(v, list) else [v]))
    assert refused > FRAMES // 2 and len(accepted) > 50
    print(f"{len(frames)} frames: {refused} refused, {len(accepted)} accepted")

    # Whatever is accepted goes through a worker slot's dispatch, with a live two-choice request named
    # as the templates name theirs, and every delta that reaches that request through its text handling.
    pool = WorkerPool(EngineConfig(model="unused"), "m", tcp_host="127.0.0.1")
    try:
        slot = pool.slots[0]
        slot._dispatch(wire.WorkerReady(model="m", architecture="a", dtype="float32",
                                        device="cpu", attention_backend="torch", quantization="none", decode_graphs="off",
                                        max_model_len=512, vocab_size=320,
                                        stats=wire.WorkerStats(0, 0, 1, 0, 0, 0, 0)))
        tokenizer = default_tokenizer()
        add = wire.AddRequest(request_id="fuzz-1", prompt_token_ids=[1], params=wire.WireSamplingParams())
        reached = 0
        for message in accepted:
            handle = slot.requests.get("fuzz-1")
            if handle is None:
                handle = slot.requests["fuzz-1"] = RequestHandle("fuzz-1", 2, slot, add)
                choices = [_Choice(i, tokenizer, [1], TextOptions(stop=("ab",))) for i in range(2)]
            slot._dispatch(message)
            while not handle.queue.empty():
                item = handle.queue.get_nowait()
                if isinstance(item, wire.TokenDelta):
                    assert 0 <= item.index < 2 and all(t < 320 for t in item.token_ids)
                    choices[item.index].advance(item)
                    reached += 1
        assert slot.ready.vocab_size == 320  # a second WorkerReady never replaces the first
        print(f"{reached} fuzzed deltas reached the request's text handling")
        assert reached > 20
    finally:
        pool.zmq_ctx.term()


@pytest.mark.parametrize("allowed", [TO_WORKER, TO_GATEWAY])
def test_an_oversized_frame_is_refused_before_parsing(allowed):
    with pytest.raises(wire.WireError, match="exceeds"):
        wire.decode(oversized_frame(), allowed)
