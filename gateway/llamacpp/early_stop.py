"""llama-server's two code-completion stops, which editor plugins set on each /infill or /completion request
(llama.vim and llama.vscode send both), so that a suggestion ends with the block being written rather than at
n_predict:
- `n_indent`: the text ends where a line after the first starts with fewer spaces or tabs than n_indent, just
  before that line's first other character (its indentation is kept, as llama-server keeps it; a blank line counts
  as indented by nothing, as there);
- `t_max_predict_ms`: once the text has a newline, generation ends when that many milliseconds have passed since
  its first token.
Either ends the request with stop_type "limit", as llama-server reports it. Unlike llama-server, which streams the
piece that broke the indentation before it cuts its answer, a stream here never sends what the whole answer drops.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EarlyStop:
    n_indent: int  # <= 0: off
    t_max_predict_ms: int  # <= 0: off
    text: str = ""
    checked_to: int = 0  # where the next line's start is looked for
    stopped: bool = False

    def take(self, piece: str, first_token_time: float | None, now: float) -> str:
        """The part of the next piece of text that stands; `stopped` turns true where the text ends."""
        if self.stopped:
            return ""
        start = len(self.text)
        self.text += piece
        if self.n_indent > 0:
            cut = self._indent_cut()
            if cut is not None:
                self.stopped = True
                self.text = self.text[:cut]
                return self.text[start:]
        if (self.t_max_predict_ms > 0 and "\n" in self.text and first_token_time is not None
                and (now - first_token_time) * 1000 > self.t_max_predict_ms):
            self.stopped = True
        return piece

    def _indent_cut(self) -> int | None:
        """Where the first line under the indentation starts its text (None: none yet, or not known yet)."""
        while (newline := self.text.find("\n", self.checked_to)) != -1:
            line = newline + 1
            end = line
            while end < len(self.text) and self.text[end] in " \t":
                end += 1
            if end == len(self.text):  # the line's indentation may go on in the next piece
                return None
            if end - line < self.n_indent:  # a blank line too, as llama-server counts it
                return end
            self.checked_to = line
        return None
