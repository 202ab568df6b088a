"""sentence-transformers as the embeddings' oracle, run in a process of its own.

Importing sentence_transformers imports scikit-learn, whose wheel loads its own libgomp. A second OpenMP runtime in
the test process turns the kernels' OpenMP bridge off (kernels/attention.py, omp_team) for every test that runs
after it, so the oracle never loads here: a child process answers JSON lines. The import takes 8-12 s, so one child
serves the whole test run, loading each checkpoint directory when an oracle for it opens and dropping it at close.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

_SERVE = r"""
import json, sys
from sentence_transformers import SentenceTransformer
loaded = {}
for line in sys.stdin:
    ask = json.loads(line)
    op, path = ask["op"], ask["path"]
    if op == "load":
        loaded[path] = SentenceTransformer(path, device="cpu", local_files_only=True)
        out = None
    elif op == "drop":
        out = loaded.pop(path, None) is not None
    elif op == "encode":
        out = loaded[path].encode(ask["texts"], convert_to_numpy=True, **ask["kwargs"]).astype("float32").tolist()
    elif op == "input_ids":
        out = [loaded[path].tokenizer(t)["input_ids"] for t in ask["texts"]]
    else:
        out = loaded[path].tokenizer.convert_tokens_to_ids(ask["token"])
    print(json.dumps(out), flush=True)
"""

_child: subprocess.Popen | None = None


def _ask(**ask):
    """One question to the shared child (started on first use, or again if it ended) and its JSON answer."""
    global _child
    if _child is None or _child.poll() is not None:
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        _child = subprocess.Popen([sys.executable, "-c", _SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)
    _child.stdin.write(json.dumps(ask) + "\n")
    _child.stdin.flush()
    line = _child.stdout.readline()
    if not line:
        raise RuntimeError(f"the sentence-transformers process ended (exit {_child.wait()})")
    return json.loads(line)


@atexit.register
def _end_child() -> None:
    if _child is not None and _child.poll() is None:
        _child.stdin.close()
        _child.wait(timeout=60)


class SentenceTransformerOracle:
    """One checkpoint directory loaded by sentence-transformers in the child process; close() (or `with`) drops it."""

    def __init__(self, model_dir: Path | str):
        self._path = str(Path(model_dir).resolve())
        _ask(op="load", path=self._path)

    def encode(self, texts: list[str], **kwargs) -> torch.Tensor:
        """SentenceTransformer.encode(texts, **kwargs) -> [len(texts), dim] float32."""
        return torch.tensor(_ask(op="encode", path=self._path, texts=texts, kwargs=kwargs), dtype=torch.float32)

    def input_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text as the model's tokenizer encodes it (special tokens, e.g. an appended EOS, included)."""
        return _ask(op="input_ids", path=self._path, texts=texts)

    def token_id(self, token: str) -> int:
        return _ask(op="token_id", path=self._path, token=token)

    def close(self) -> None:
        _ask(op="drop", path=self._path)

    def __enter__(self) -> SentenceTransformerOracle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
