"""Everything the gateway knows about the served model's text side: tokenizer, chat template, and
whether its output carries <think> reasoning."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from gateway.chat_template import ChatTemplate, ChatTemplateError, NoChatTemplate
from gateway.errors import invalid
from gateway.reasoning import has_reasoning_tokens


class ModelText:
    def __init__(self, model_dir: str | Path):
        model_dir = Path(model_dir)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.template = ChatTemplate.from_model_dir(model_dir)
        self.split_reasoning = has_reasoning_tokens(self.tokenizer)

    def encode_prompt(self, prompt: str | tuple[int, ...]) -> list[int]:
        if isinstance(prompt, tuple):
            return list(prompt)
        return self.tokenizer.encode(prompt, add_special_tokens=True).ids

    def render_chat(self, messages: list[dict[str, str]], template_kwargs: dict) -> tuple[str, list[int]]:
        """The rendered prompt and its token ids. The template writes the special tokens itself, so the
        tokenizer adds none."""
        try:
            text = self.template.render(messages, add_generation_prompt=True, template_kwargs=template_kwargs)
        except NoChatTemplate as e:
            raise invalid(str(e), "messages") from None
        except ChatTemplateError as e:
            raise invalid(f"the chat template failed: {e}", "messages") from None
        return text, self.tokenizer.encode(text, add_special_tokens=False).ids

    def starts_in_reasoning(self, rendered_prompt: str) -> bool:
        """Newer Qwen3 templates open <think> in the prompt itself; the output then begins inside it."""
        return self.split_reasoning and rendered_prompt.rstrip().endswith("<think>")

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)
