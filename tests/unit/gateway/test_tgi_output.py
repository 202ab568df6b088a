"""TGI's response objects from a completion's events (gateway/huggingface/tgi_output.py): streamed tokens whose texts add
up to the generated text however the events split them, the last token carrying generated_text and the details, and
/generate's details with each token's own text."""

from __future__ import annotations

from gateway.huggingface.tgi_output import TgiOutput, TgiRequestView, special_ids
from gateway.openai.response_bodies import TokenNames
from gateway.streams.choice_stream import ChoiceEvent, TokenLogprob, Usage
from gateway.text.detokenizer import IncrementalDetokenizer
from tests.helpers.toy_tokenizers import byte_bpe

TEXT = "naïve café 😀 déjà"


def _view(**changes) -> TgiRequestView:
    fields = dict(prompt_text="P: ", prompt_ids=[1, 2], return_full_text=False, details=True, prefill_details=False,
                  top_n_tokens=0, seed=None)
    return TgiRequestView(**{**fields, **changes})


def _events(tok, ids: list[int], sizes: list[int], end: int) -> list[ChoiceEvent]:
    """The choice events a stream of `ids` makes, `sizes` tokens at a time, ended by the stop token `end`, their
    texts as the gateway's detokenizer writes them."""
    detok, events, at = IncrementalDetokenizer(tok, []), [], 0
    for size in sizes:
        chunk = ids[at:at + size]
        at += size
        last = at >= len(ids)
        text = detok.push(chunk) + (detok.flush() if last else "")
        lps = [TokenLogprob(t, -0.5, [(t, -0.5)]) for t in chunk + ([end] if last else [])]
        events.append(ChoiceEvent(0, text=text, logprobs=lps, finish_reason="stop" if last else None,
                                  ends_on_stop_token=last, token_ids=[lp.token_id for lp in lps]))
        if last:
            return events
    raise AssertionError("sizes cover fewer tokens than ids has")


def test_streamed_texts_add_up_however_the_events_split_the_tokens():
    tok = byte_bpe()
    ids = tok.encode(TEXT).ids
    end = tok.token_to_id("<|end|>")
    assert len(ids) >= 6
    for sizes in ([1] * len(ids), [2] * (len(ids) // 2 + 1), [len(ids)], [3, 1, len(ids)]):
        output = TgiOutput(_view(), TokenNames(tok), special_ids(tok))
        usage = Usage(prompt_tokens=2, completion_tokens=len(ids) + 1)
        sent = [event for e in _events(tok, ids, sizes, end) for event in output.feed(e, usage)]
        assert [e["token"]["id"] for e in sent] == ids + [end]
        assert [e["index"] for e in sent] == list(range(1, len(sent) + 1))
        assert "".join(e["token"]["text"] for e in sent) == TEXT, sizes
        assert sent[-1]["token"]["special"] and sent[-1]["token"]["text"] == ""
        assert [e["generated_text"] for e in sent] == [None] * (len(sent) - 1) + [TEXT]
        assert sent[-1]["details"] == {"finish_reason": "eos_token", "generated_tokens": len(ids) + 1, "seed": None,
                                       "input_length": 2}
        assert all(e["details"] is None for e in sent[:-1])


def test_one_token_a_step_sends_each_tokens_own_text():
    tok = byte_bpe()
    ids = tok.encode("plain ascii words").ids
    output = TgiOutput(_view(), TokenNames(tok), special_ids(tok))
    sent = [event for e in _events(tok, ids, [2, 2, len(ids)], tok.token_to_id("<|end|>"))
            for event in output.feed(e, Usage())]
    assert [e["token"]["text"] for e in sent[:-1]] == [tok.decode([i]) for i in ids]


def test_text_with_no_token_goes_with_the_next_or_closes_the_stream():
    tok = byte_bpe()
    a, b = tok.encode("plain").ids[0], tok.encode(" ascii").ids[0]
    output = TgiOutput(_view(return_full_text=True, details=False), TokenNames(tok), special_ids(tok))
    usage = Usage(prompt_tokens=2, completion_tokens=2)
    first = output.feed(ChoiceEvent(0, text="x", logprobs=[TokenLogprob(a, -1.0, [])]), usage)
    assert output.feed(ChoiceEvent(0, text="y"), usage) == []  # held for the next token
    second = output.feed(ChoiceEvent(0, text="z", logprobs=[TokenLogprob(b, -2.0, [])]), usage)
    assert [e["token"]["text"] for e in first + second] == ["x", "yz"]
    closing = output.feed(ChoiceEvent(0, text="!", finish_reason="length"), usage)
    assert [e["token"] for e in closing] == [{"id": b, "text": "!", "logprob": None, "special": True}]
    assert closing[0]["generated_text"] == "P: xyz!" and closing[0]["details"] is None  # details not asked for


def test_whole_answer_details():
    tok = byte_bpe()
    ids = tok.encode("plain words").ids
    end = tok.token_to_id("<|end|>")
    output = TgiOutput(_view(top_n_tokens=1, seed=7), TokenNames(tok), special_ids(tok))
    usage = Usage(prompt_tokens=2, completion_tokens=len(ids) + 1)
    for e in _events(tok, ids, [len(ids)], end):
        output.feed(e, usage)
    body = output.whole(usage)
    assert body["generated_text"] == "plain words"
    details = body["details"]
    assert [t["text"] for t in details["tokens"]] == [tok.decode([i]) for i in ids] + [tok.id_to_token(end)]
    assert [t["special"] for t in details["tokens"]] == [False] * len(ids) + [True]
    assert details["top_tokens"] == [[t] for t in details["tokens"]] and details["seed"] == 7
    assert details["finish_reason"] == "eos_token" and details["prefill"] == []
