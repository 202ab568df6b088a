"""Deadlines in the engine: a queued request whose time ran out is dropped without computing it, a running
one stops at the next step with its blocks freed, and neither disturbs the others."""

from __future__ import annotations

import time

import pytest

from shared.sampling_params import SamplingParams
from tests.helpers.engine_probe import make_engine
from tests.helpers.tiny_models import build_tiny_model
from worker.core.deadlines import DeadlineQueue

VOCAB = 320
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture
def engine(tmp_path, test_seed):
    build_tiny_model("qwen3", test_seed, tmp_path / "m", vocab_size=VOCAB)
    return make_engine(tmp_path / "m", max_num_seqs=1, max_num_batched_tokens=64, block_size=8, num_kv_blocks=64)


def prompt(start: int, n: int = 24) -> list[int]:
    return [(start + i) % (VOCAB - 3) + 3 for i in range(n)]


def step_outputs(engine) -> dict[str, list]:
    by_request: dict[str, list] = {}
    for out in engine.step():
        by_request.setdefault(out.request_id, []).append(out)
    return by_request


def test_queue_order():
    q = DeadlineQueue()
    q.add("b", 2.0)
    q.add("a", 1.0)
    q.add("c", 3.0)
    assert q.expired(0.5) == []
    assert q.expired(2.0) == [("a", 1.0), ("b", 2.0)]
    assert len(q) == 1 and q.expired(10.0) == [("c", 3.0)]


def test_queued_request_is_dropped_without_compute(engine):
    engine.add_request("busy", prompt(0), GREEDY)
    engine.add_request("late", prompt(50), GREEDY, deadline=time.monotonic() + 0.05)
    produced = sum(len(o.new_token_ids) for o in engine.step())  # "busy" takes the only running slot
    late = engine._requests["late"][0]
    assert late in engine.scheduler.waiting
    time.sleep(0.06)
    outs = step_outputs(engine)
    assert [(o.finish_reason, o.new_token_ids) for o in outs["late"]] == [("deadline", [])]
    assert late.num_computed_tokens == 0 and late.block_table == [] and late.queue_time is None
    assert "late" not in engine._requests
    # "busy" runs on undisturbed, to its end.
    produced += sum(len(o.new_token_ids) for o in outs["busy"])
    while engine.has_unfinished_requests():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    assert produced == GREEDY.max_tokens
    assert engine.block_manager.num_used_blocks == 0


def test_running_request_stops_at_the_next_step_and_frees_its_blocks(engine):
    engine.add_request("r", prompt(7), SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, n=2),
                       deadline=time.monotonic() + 3.0)  # ample to start decoding, even on a busy machine
    tokens = 0
    for _ in range(30):  # into decoding
        tokens += sum(len(o.new_token_ids) for o in engine.step())
        if tokens >= 4:
            break
    assert tokens >= 4 and engine.has_unfinished_requests()
    assert engine.block_manager.num_used_blocks > 0
    time.sleep(max(0.0, engine._requests["r"][0].deadline - time.monotonic()))
    outs = step_outputs(engine)
    assert sorted((o.index, o.finish_reason, o.new_token_ids) for o in outs["r"]) == \
        [(0, "deadline", []), (1, "deadline", [])]
    assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished_requests()
    engine.block_manager.check_invariants()
    assert engine.kv_audit.check([]).ok


def test_a_deadline_already_past_costs_nothing_and_a_finished_request_is_not_touched(engine):
    engine.add_request("gone", prompt(3), GREEDY, deadline=time.monotonic() - 1)
    outs = step_outputs(engine)
    assert [(o.finish_reason, o.num_cached_tokens) for o in outs["gone"]] == [("deadline", 0)]
    assert engine.scheduler.prefix_query_tokens == 0  # never admitted
    # A request that finishes before its deadline ends normally; the stale entry is ignored later, even
    # when its id is reused by a request without a deadline.
    short = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    stale = time.monotonic() + 1.5
    engine.add_request("quick", prompt(9), short, deadline=stale)
    reasons = []
    while engine.has_unfinished_requests():
        reasons += [o.finish_reason for o in engine.step() if o.finish_reason]
    assert reasons == ["length"] and time.monotonic() < stale
    engine.add_request("quick", prompt(9), short)
    time.sleep(max(0.0, stale - time.monotonic()) + 0.01)
    reasons = []
    while engine.has_unfinished_requests():
        reasons += [o.finish_reason for o in engine.step() if o.finish_reason]
    assert reasons == ["length"]


def test_timeout_header_and_flag_parsing(capsys):
    from gateway.cli import main
    from gateway.server.deadlines import parse_timeout
    from gateway.server.errors import ApiError

    assert parse_timeout(None, None) is None
    assert parse_timeout(None, 7.0) == 7.0  # the server default
    assert parse_timeout(" 2.5 ", 7.0) == 2.5  # the header wins
    for bad in ("", "soon", "0", "-3", "inf", "nan", "1e12"):
        with pytest.raises(ApiError) as e:
            parse_timeout(bad, None)
        assert e.value.status == 400 and e.value.param == "X-Request-Timeout"
    assert main(["serve", "--request-timeout", "-1"]) == 2
    assert "--request-timeout must be 0" in capsys.readouterr().err
