"""Chat templates from the model directory, rendered in jinja2's immutable sandbox.

Rendering follows transformers' `apply_chat_template` (trim_blocks, lstrip_blocks, `raise_exception`,
`strftime_now`, a `tojson` that keeps non-ASCII) so templates written for it work unchanged. Only the
model's own template is used; a request can pass variables (chat_template_kwargs) but never a template.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the conversation or failed to render."""


class NoChatTemplate(ChatTemplateError):
    pass


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env


def _token_string(value: Any) -> str:
    """tokenizer_config's special tokens are strings or AddedToken dicts."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = None
        if source is not None:
            try:
                self._template = _environment().from_string(source)
            except TemplateError as e:
                raise ChatTemplateError(f"the model's chat template does not compile: {e}") from e

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> "ChatTemplate":
        model_dir = Path(model_dir)
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default")
        jinja_file = model_dir / "chat_template.jinja"
        if jinja_file.is_file():  # transformers prefers the standalone file when both exist
            source = jinja_file.read_text()
        return cls(source, _token_string(config.get("bos_token")), _token_string(config.get("eos_token")))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               template_kwargs: dict[str, Any] | None = None) -> str:
        if self._template is None:
            raise NoChatTemplate("this model has no chat template; use /v1/completions with a plain prompt")
        # The request's variables come first so they can never replace the conversation itself.
        context = {**(template_kwargs or {}), "messages": messages, "add_generation_prompt": add_generation_prompt,
                   "bos_token": self.bos_token, "eos_token": self.eos_token}
        try:
            return self._template.render(**context)
        except ChatTemplateError:
            raise
        except TemplateError as e:  # SecurityError (sandbox) included
            raise ChatTemplateError(str(e)) from e
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise ChatTemplateError(f"{type(e).__name__}: {e}") from e
