"""Stop strings over streamed text: nothing of a stop string reaches the client (unless it asked for the one that
ended the text, vLLM's include_stop_str_in_output).

Text that could still grow into a stop string (a suffix that is a proper prefix of some stop) is held
back until the next piece settles it, so a stop string may span any number of pieces. The stop that
completes first wins, as it would if the text arrived one character at a time: the result never
depends on how the text was cut into pieces (a stream cannot wait to see whether a longer stop that
began earlier will still complete). Among stops completing at the same character, the longest wins,
so no part of it is emitted.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str], include_stop: bool = False):
        if not stops or any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = list(dict.fromkeys(stops))
        self.include_stop = include_stop
        self.held = ""  # never contains a whole stop string, so every match ends in newly fed text
        self.matched: str | None = None  # the stop string that was hit

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was hit). After a hit the emitted text ends
        where the stop string begins (include_stop: where it ends); the matcher must not be fed again."""
        buf = self.held + text
        # Per stop its first occurrence, which is also its earliest completion; then (end, start) order.
        hits = [(i + len(s), i) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            end, start = min(hits)
            self.held, self.matched = "", buf[start:end]
            return buf[:end if self.include_stop else start], True
        keep = max(_partial_suffix(buf, s) for s in self.stops)
        self.held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        """The held-back tail, when the output ends without a stop string."""
        held, self.held = self.held, ""
        return held


def _partial_suffix(buf: str, stop: str) -> int:
    """Length of the longest suffix of buf that is a proper prefix of stop."""
    tail = buf[len(buf) - min(len(buf), len(stop) - 1):]
    # Candidates start where stop's first character occurs; the leftmost match is the longest.
    start = tail.find(stop[0])
    while start >= 0:
        if stop.startswith(tail[start:]):
            return len(tail) - start
        start = tail.find(stop[0], start + 1)
    return 0
