"""llama-server's code-completion stops (gateway/llamacpp/early_stop.py): n_indent ends the text before the first
character of a later line indented less (a blank line too), wherever the pieces break; t_max_predict_ms ends it once
a newline has come and the time is up."""

from __future__ import annotations

import pytest

from gateway.llamacpp.early_stop import EarlyStop


def run(stop: EarlyStop, pieces: list[str], times: list[float] | None = None) -> str:
    kept = ""
    for i, piece in enumerate(pieces):
        kept += stop.take(piece, 0.0, times[i] if times else 0.0)
        if stop.stopped:
            break
    return kept


@pytest.mark.parametrize("pieces, n_indent, kept", [
    (["def f():\n", "    x = 1\n", "    return x\n", "print(f())"], 4, "def f():\n    x = 1\n    return x\n"),
    (["x = 1\n  y"], 4, "x = 1\n  "),  # the short line's indentation stays
    (["  a", "\n", " ", " ", " b\n", " c"], 3, "  a\n   b\n "),  # indentation split over pieces
    (["a\n\tb\nc"], 1, "a\n\tb\n"),  # a tab is one
    (["a\n", "\n", "  b"], 2, "a\n"),  # a blank line is indented by nothing, as llama-server counts it
    (["x", "yz", "\n    more"], 4, "xyz\n    more"),  # the first line is never checked; deep enough lines go on
    (["a\nb"], 0, "a\nb"),  # off
])
def test_n_indent_ends_the_text_before_a_shallower_line(pieces, n_indent, kept):
    stop = EarlyStop(n_indent, 0)
    assert run(stop, pieces) == kept
    assert stop.stopped == (kept != "".join(pieces)) and stop.text == kept


def test_a_line_whose_indentation_is_still_coming_is_not_judged_yet():
    stop = EarlyStop(4, 0)
    assert stop.take("a\n  ", 0.0, 0.0) == "a\n  " and not stop.stopped
    assert stop.take("  b", 0.0, 0.0) == "  b" and not stop.stopped


def test_t_max_predict_ms_ends_the_text_after_a_newline_once_the_time_is_up():
    stop = EarlyStop(0, 100)
    assert run(stop, ["a", "b", "c\n", "d", "e"], [0.5, 0.6, 0.7, 0.75, 0.8]) == "abc\n"  # a newline, then late
    assert stop.stopped
    late_without_newline = EarlyStop(0, 100)
    assert run(late_without_newline, ["a", "b", "c"], [1.0, 2.0, 3.0]) == "abc" and not late_without_newline.stopped
    in_time = EarlyStop(0, 100)
    assert run(in_time, ["a\n", "b"], [0.01, 0.05]) == "a\nb" and not in_time.stopped
