"""A served tiny Qwen3 whose answer is fixed: after a newline it writes one chosen token, then ends (EOS).

For driving agent clients (Codex, Claude Code) through a whole turn on a model that stops, with their full
prompts (longer than the default model's context) and at the speed of a tiny model. It is a real checkpoint the
engine runs as any other: its attention and MLP outputs are zero, so each position's hidden state is its own
token's embedding, and the embeddings and LM head are set so that the next token depends on the current one
alone, with a margin no sampling temperature undoes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tests.helpers.server import Server, build_served_tiny_model

NEWLINE, EOS, OK = 198, 2, 2231  # the default model's tokenizer: "\n", <|im_end|> and "ok"


def build_scripted_model(out_dir: Path, answer_token: int, max_positions: int = 16384) -> Path:
    """A model that answers a prompt ending in a newline (a chat template's assistant header) with answer_token."""
    build_served_tiny_model("qwen3", 0, out_dir, max_positions=max_positions)
    path = out_dir / "model.safetensors"
    weights = load_file(str(path))
    hidden = weights["model.norm.weight"].shape[0]
    for name, tensor in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor.zero_()  # no layer writes to the residual stream
    embed = torch.zeros_like(weights["model.embed_tokens.weight"])  # [vocab, hidden], tied to the LM head
    embed[:, 2] = 1.0  # any other token: direction 2
    embed[NEWLINE] = torch.nn.functional.one_hot(torch.tensor(0), hidden).float()
    embed[answer_token] = torch.nn.functional.one_hot(torch.tensor(1), hidden).float()
    weights["model.embed_tokens.weight"] = embed
    # The tied head scores token t by its embedding: the newline (direction 0) must lead to answer_token and
    # everything else to EOS, so the head needs rows of its own. Untie it.
    head = torch.zeros_like(embed)
    head[answer_token, 0] = 100.0
    head[EOS, 1] = head[EOS, 2] = 100.0
    weights["lm_head.weight"] = head
    weights["model.norm.weight"] = torch.ones(hidden)
    save_file(weights, str(path))
    config_path = out_dir / "config.json"
    config = config_path.read_text().replace('"tie_word_embeddings": true', '"tie_word_embeddings": false')
    config_path.write_text(config)
    return out_dir


def start_scripted_server(tmp_path_factory, served_name: str, max_positions: int = 65536) -> Server:
    """`mili serve` on a model scripted to answer "ok", with a KV cache that holds one whole context."""
    model = build_scripted_model(tmp_path_factory.mktemp("scripted") / "model", OK, max_positions=max_positions)
    return Server(model, "--served-model-name", served_name, "--num-kv-blocks", str(max_positions // 16 + 1),
                  log_path=tmp_path_factory.mktemp(served_name) / "server.log").start()
