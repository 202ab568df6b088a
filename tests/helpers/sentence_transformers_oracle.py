"""sentence-transformers as the embeddings' oracle, run in a process of its own.

Importing sentence_transformers imports scikit-learn, whose wheel loads its own libgomp. A second OpenMP runtime in
the test process turns the kernels' OpenMP bridge off (kernels/attention.py, omp_team) for every test that runs
after it, so the oracle never loads here: a child process loads the checkpoint once and answers JSON lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

_SERVE = r"""
import json, sys
from sentence_transformers import SentenceTransformer
st = SentenceTransformer(sys.argv[1], device="cpu", local_files_only=True)
for line in sys.stdin:
    ask = json.loads(line)
    if ask["op"] == "encode":
        out = st.encode(ask["texts"], convert_to_numpy=True, **ask["kwargs"]).astype("float32").tolist()
    elif ask["op"] == "input_ids":
        out = [st.tokenizer(t)["input_ids"] for t in ask["texts"]]
    else:
        out = st.tokenizer.convert_tokens_to_ids(ask["token"])
    print(json.dumps(out), flush=True)
"""


class SentenceTransformerOracle:
    """One checkpoint directory loaded by sentence-transformers in a child process; close() (or `with`) ends it."""

    def __init__(self, model_dir: Path | str):
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(model_dir)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env)

    def _ask(self, **ask):
        self._proc.stdin.write(json.dumps(ask) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the sentence-transformers process ended (exit {self._proc.wait()})")
        return json.loads(line)

    def encode(self, texts: list[str], **kwargs) -> torch.Tensor:
        """SentenceTransformer.encode(texts, **kwargs) -> [len(texts), dim] float32."""
        return torch.tensor(self._ask(op="encode", texts=texts, kwargs=kwargs), dtype=torch.float32)

    def input_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text as the model's tokenizer encodes it (special tokens, e.g. an appended EOS, included)."""
        return self._ask(op="input_ids", texts=texts)

    def token_id(self, token: str) -> int:
        return self._ask(op="token_id", token=token)

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=60)

    def __enter__(self) -> SentenceTransformerOracle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
