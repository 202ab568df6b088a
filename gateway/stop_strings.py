"""Stop strings over streamed text: nothing of a stop string ever reaches the client.

Text that could still grow into a stop string (a suffix that is a prefix of some stop) is held back
until the next piece settles it; a stop string may therefore span any number of tokens.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str]):
        if not stops or any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self.stops = list(stops)
        self.held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was hit). After a hit the emitted text ends where
        the stop string begins, and the matcher must not be fed again."""
        buf = self.held + text
        # The stop that completes first wins (a stream cannot wait to see whether a longer one that began
        # earlier will complete); among stops completing at the same character, the longest.
        # `held` never contains a whole stop string, so any match ends in the new text.
        hits = [(i + len(s), i) for s in self.stops if (i := buf.find(s)) >= 0]
        if hits:
            self.held = ""
            return buf[:min(hits)[1]], True
        keep = max(self._partial_suffix(buf, s) for s in self.stops)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        """The held-back tail, when the output ends without a stop string."""
        held, self.held = self.held, ""
        return held

    @staticmethod
    def _partial_suffix(buf: str, stop: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of stop."""
        tail = buf[-(len(stop) - 1):] if len(stop) > 1 else ""
        start = tail.find(stop[0])
        while start >= 0:
            if stop.startswith(tail[start:]):
                return len(tail) - start
            start = tail.find(stop[0], start + 1)
        return 0
