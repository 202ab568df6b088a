"""Stop strings against a one-character-at-a-time oracle: the output is cut exactly where the first stop
string to complete begins, nothing of a stop string is ever emitted (not even a piece that later turns
out to be its start), and text that cannot be the start of a stop is not held back."""

from __future__ import annotations

import random

import pytest

from gateway.text.stop_strings import StopStringMatcher


def oracle_cut(text: str, stops: list[str], include_stop: bool = False) -> tuple[str, bool]:
    """Scan the text as it grows: cut at the first stop string to complete (the longest, on a tie), before it or,
    include_stop, after it."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            return text[:end if include_stop else end - max(map(len, done))], True
    return text, False


def oracle_held(text: str, stops: list[str]) -> int:
    """How much of the text must still be held back: its longest suffix that begins some stop."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


def run(matcher: StopStringMatcher, pieces: list[str], stops: list[str]) -> tuple[list[str], bool]:
    emitted, fed, hit = [], "", False
    for piece in pieces:
        out, hit = matcher.feed(piece)
        emitted.append(out)
        fed += piece
        if hit:
            break
        # Held back: exactly the part that may still become a stop string, and no more.
        assert len(fed) - len("".join(emitted)) == oracle_held(fed, stops), (fed, stops)
    if not hit:
        emitted.append(matcher.flush())
    return emitted, hit


def random_pieces(rng: random.Random, text: str) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randrange(0, 12)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])] if text else [""]


@pytest.mark.parametrize("include_stop", [False, True], ids=["cut-before", "include-stop"])
@pytest.mark.parametrize("alphabet", ["ab", "abc", "aé😀 \n"])
def test_random_texts_and_stops_against_the_oracle(alphabet, include_stop, test_seed):
    rng = random.Random(test_seed)
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 7))) for _ in range(rng.randrange(1, 17))]
        emitted, hit = run(StopStringMatcher(stops, include_stop), random_pieces(rng, text), stops)
        expected, expected_hit = oracle_cut(text, stops, include_stop)
        assert ("".join(emitted), hit) == (expected, expected_hit), (text, stops)
        # Nothing past the cut was ever emitted, even for a moment: every emitted prefix is a prefix of it.
        assert all(expected.startswith("".join(emitted[:k])) for k in range(len(emitted) + 1)), (text, stops)


def test_the_result_does_not_depend_on_how_the_text_is_cut(test_seed):
    rng = random.Random(test_seed)
    for _ in range(200):
        text = "".join(rng.choice("xyz") for _ in range(30))
        stops = ["".join(rng.choice("xyz") for _ in range(rng.randrange(1, 5))) for _ in range(3)]
        one_piece = run(StopStringMatcher(stops), [text], stops)
        per_char = run(StopStringMatcher(stops), list(text), stops)
        assert ("".join(one_piece[0]), one_piece[1]) == ("".join(per_char[0]), per_char[1])


def test_a_stop_spanning_several_pieces_never_leaks():
    m = StopStringMatcher(["</answer>"])
    assert m.feed("The result <") == ("The result ", False)
    assert m.feed("/ans") == ("", False)
    assert m.feed("wer") == ("", False)
    assert m.feed(">trailing text") == ("", True)


def test_a_false_start_is_released_once_it_cannot_be_a_stop():
    m = StopStringMatcher(["STOP"])
    assert m.feed("ST") == ("", False)
    assert m.feed("OOP") == ("STOOP", False)
    assert m.feed("ST") == ("", False)
    assert m.flush() == "ST"  # the output ended without a stop: the held tail is text after all


def test_a_stop_at_the_very_start():
    m = StopStringMatcher(["Hello"])
    assert m.feed("Hello world") == ("", True)
    m = StopStringMatcher(["\n"])
    assert m.feed("\nrest") == ("", True)


def test_overlapping_stops():
    # "bc" completes before "abcd" could: cut there, even though "abcd" began earlier.
    assert StopStringMatcher(["abcd", "bc"]).feed("xabcd") == ("xa", True)
    # Both complete at the same character: the longer one is cut whole.
    assert StopStringMatcher(["bc", "abc"]).feed("xabc") == ("x", True)
    # A stop overlapping itself: "aab" inside "aaab" starts at the second "a".
    m = StopStringMatcher(["aab"])
    assert m.feed("a") == ("", False)
    assert m.feed("a") == ("", False)
    assert m.feed("a") == ("a", False)
    assert m.feed("b") == ("", True)


def test_duplicate_stops_and_empty_ones():
    assert StopStringMatcher(["x", "x"]).feed("abxc") == ("ab", True)
    with pytest.raises(ValueError):
        StopStringMatcher([""])
    with pytest.raises(ValueError):
        StopStringMatcher([])


def test_many_long_stops_over_a_long_stream(test_seed):
    rng = random.Random(test_seed)
    stops = ["".join(rng.choice("ab") for _ in range(300)) for _ in range(16)]
    text = "".join(rng.choice("ab") for _ in range(3000)) + stops[5] + "tail"
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    emitted, hit = run(StopStringMatcher(stops), pieces, stops)
    assert ("".join(emitted), hit) == oracle_cut(text, stops)
