"""`mili convert-gguf` as a user runs it: a real subprocess, exit codes, messages."""

from __future__ import annotations

import os
import subprocess
import sys

from shared.default_model import default_gguf_path
from worker.checkpoint.model_config import ModelConfig


def mili(*args: str) -> subprocess.CompletedProcess:
    # The environment as Python sees it, given explicitly: a Mojo module loaded earlier in this process
    # setenv()s PYTHONEXECUTABLE at the C level, and a child inheriting that would lose the virtual environment.
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))


def test_convert_gguf_writes_a_loadable_directory(tmp_path):
    out = tmp_path / "smollm2"
    result = mili("convert-gguf", str(default_gguf_path()), str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert (out / name).is_file(), name
    cfg = ModelConfig.from_dir(out)
    assert (cfg.architecture, cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads) == ("LlamaForCausalLM", 30, 576, 3)
    # A second conversion into the now-full directory is refused, not overwritten.
    again = mili("convert-gguf", str(default_gguf_path()), str(out))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_convert_gguf_errors_are_one_line_not_tracebacks(tmp_path):
    missing = mili("convert-gguf", str(tmp_path / "nope.gguf"), str(tmp_path / "out"))
    assert missing.returncode == 2 and "No such file" in missing.stderr and "Traceback" not in missing.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not gguf")
    bad = mili("convert-gguf", str(junk), str(tmp_path / "out"))
    assert bad.returncode == 2 and "not a GGUF file" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "out").exists()


def test_serve_refuses_a_bad_chat_template_or_template_kwargs_at_startup(tmp_path):
    """Before any model loads: one line naming the flag, exit status 2."""
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}never closed")
    cases = [(("--chat-template", str(tmp_path / "missing.jinja")), "--chat-template", "cannot read"),
             (("--chat-template", str(broken)), "--chat-template", "does not compile"),
             (("--default-chat-template-kwargs", "{enable_thinking: false}"), "--default-chat-template-kwargs",
              "not valid JSON"),
             (("--default-chat-template-kwargs", "[1]"), "--default-chat-template-kwargs", "must be a JSON object")]
    for flags, flag, words in cases:
        result = mili("serve", "--model", str(tmp_path / "no-model-here"), *flags)
        assert result.returncode == 2, (flags, result.stderr)
        assert flag in result.stderr and words in result.stderr and "Traceback" not in result.stderr, result.stderr
