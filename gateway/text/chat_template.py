"""Chat templates from the model directory, rendered in jinja2's immutable sandbox.

Rendering follows transformers' `apply_chat_template` (trim_blocks, lstrip_blocks, loop controls,
`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII and does not HTML-escape) so
templates written for it work unchanged. Only the model's own template is used, or the one the server was
started with (--chat-template); a request can pass variables (chat_template_kwargs) but never a template,
and never replace the conversation.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the conversation or failed to render (a 400 for the request)."""


class NoChatTemplate(ChatTemplateError):
    """The model has no chat template, so /v1/chat/completions cannot serve it."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja2's own tojson HTML-escapes (<, >, &, ') and sorts keys; templates expect plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _compile(source: str) -> Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def _token_string(value: Any) -> str:
    """tokenizer_config's special tokens are strings or AddedToken dicts ({"content": ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str = "", eos_token: str = ""):
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template: Template | None = None
        if source is not None:
            try:
                self._template = _compile(source)
            except TemplateError as e:
                raise ChatTemplateError(f"the chat template does not compile: {e}") from e

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, replacement: str | None = None) -> ChatTemplate:
        """The template as transformers would pick it: `chat_template.jinja` if present, else
        tokenizer_config.json's `chat_template` (a string, or named templates of which "default").
        `replacement` (--chat-template's file) replaces it; the special tokens still come from the model."""
        model_dir = Path(model_dir)
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
        source = config.get("chat_template")
        if isinstance(source, list):  # [{"name": ..., "template": ...}]
            source = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}.get("default")
        jinja_file = model_dir / "chat_template.jinja"
        if jinja_file.is_file():
            source = jinja_file.read_text(encoding="utf-8")
        if replacement is not None:
            source = replacement
        return cls(source if isinstance(source, str) else None,
                   _token_string(config.get("bos_token")), _token_string(config.get("eos_token")))

    @property
    def supports_tools(self) -> bool:
        """Whether the template reads a `tools` variable (as transformers' templates with tool use do)."""
        return self.source is not None and "tools" in self.source

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               template_kwargs: dict[str, Any] | None = None, tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text for a conversation. `template_kwargs` (a request's chat_template_kwargs,
        e.g. {"enable_thinking": False}) become template variables."""
        if self._template is None:
            raise NoChatTemplate("this model has no chat template; use /v1/completions with a plain prompt")
        # Request variables go first so they can never replace the conversation or the special tokens.
        context = {**(template_kwargs or {}), "messages": messages, "add_generation_prompt": add_generation_prompt,
                   "bos_token": self.bos_token, "eos_token": self.eos_token}
        if tools is not None:
            context["tools"] = tools
        try:
            return self._template.render(**context)
        except ChatTemplateError:
            raise
        except TemplateError as e:  # the sandbox's SecurityError included
            raise ChatTemplateError(f"{type(e).__name__}: {e}") from e
        except Exception as e:
            # The template is the model's code; whatever it raises on this conversation (a bad index,
            # a division, a method on a missing field) means this request cannot be rendered.
            raise ChatTemplateError(f"{type(e).__name__}: {e}") from e


def read_template_file(path: str | Path) -> str:
    """--chat-template's file, read and compiled once at startup: a missing file or a template that does not
    compile is a ValueError naming the flag, before the model loads."""
    try:
        source = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--chat-template {path}: cannot read the file: {e}") from None
    try:
        ChatTemplate(source)
    except ChatTemplateError as e:
        raise ValueError(f"--chat-template {path}: {e}") from None
    return source


def parse_template_kwargs(text: str) -> dict[str, Any]:
    """--default-chat-template-kwargs: a JSON object of template variables (ValueError naming the flag)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--default-chat-template-kwargs: not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError("--default-chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value
