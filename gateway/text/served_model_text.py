"""Everything the gateway knows about the served model's text side: tokenizer, chat template, and
whether its output carries <think> reasoning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from gateway.server.errors import invalid
from gateway.text.chat_template import ChatTemplate, ChatTemplateError, NoChatTemplate
from gateway.text.fill_in_middle import SPELLINGS, fim_prompt, fim_tokens
from gateway.text.grammars import GrammarChecker
from gateway.text.reasoning import has_reasoning_tokens
from gateway.text.tool_specs import CALL_CLOSE, CALL_OPEN, ToolSpec, generic_messages


class ModelText:
    def __init__(self, model_dir: str | Path, chat_template: str | None = None,
                 default_template_kwargs: dict[str, Any] | None = None):
        """`chat_template`: a template replacing the model's (--chat-template); `default_template_kwargs`:
        template variables every request gets unless its own chat_template_kwargs set them
        (--default-chat-template-kwargs)."""
        model_dir = Path(model_dir)
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.template = ChatTemplate.from_model_dir(model_dir, chat_template)
        self.default_template_kwargs = dict(default_template_kwargs or {})
        self.split_reasoning = has_reasoning_tokens(self.tokenizer)
        self.grammars = GrammarChecker(self.tokenizer)
        self.fim = fim_tokens(self.tokenizer)  # None: the model cannot fill in the middle

    def encode_prompt(self, prompt: str | tuple[int, ...], suffix: str | None = None) -> list[int]:
        """A completion's prompt as token ids; with a `suffix`, the fill-in-the-middle prompt asking for the text
        between them (gateway/text/fill_in_middle.py; a 400 where the model has no such tokens). A suffix comes
        with text prompts only (gateway/openai/parse.py)."""
        if suffix:
            if self.fim is None:
                raise invalid("suffix needs a model trained to fill in the middle; this model's tokenizer has none "
                              "of the fill-in-the-middle tokens (" + ", ".join(SPELLINGS[0]) + ")", "suffix")
            assert isinstance(prompt, str)
            return fim_prompt(self.tokenizer, self.fim, prompt, suffix)
        if isinstance(prompt, tuple):
            return list(prompt)
        return self.tokenizer.encode(prompt, add_special_tokens=True).ids

    def render_chat(self, messages: list[dict[str, Any]], template_kwargs: dict, tools: ToolSpec | None = None,
                    add_generation_prompt: bool = True,
                    continue_final_message: bool = False) -> tuple[str, list[int]]:
        """The rendered prompt and its token ids. The template writes the special tokens itself, so the
        tokenizer adds none. Tools go to the template's `tools` variable where it has one; otherwise the
        conversation is rewritten into the generic tool format (tools.generic_messages). With
        `continue_final_message` the prompt ends with the last message's text, its turn left open."""
        has_tool_turns = any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
        template_tools = None
        if self.template.supports_tools:
            if tools is not None and tools.calls_possible:
                template_tools = [t.as_openai() for t in tools.tools]
        elif has_tool_turns or (tools is not None and tools.calls_possible):
            messages = generic_messages(messages, tools)
        try:
            text = self.template.render(messages, add_generation_prompt=add_generation_prompt,
                                        template_kwargs={**self.default_template_kwargs, **template_kwargs},
                                        tools=template_tools)
        except NoChatTemplate as e:
            raise invalid(str(e), "messages") from None
        except ChatTemplateError as e:
            raise invalid(f"the chat template failed: {e}", "messages") from None
        if continue_final_message:
            text = _open_final_message(text, messages[-1]["content"])
        return text, self.tokenizer.encode(text, add_special_tokens=False).ids

    def starts_in_reasoning(self, rendered_prompt: str) -> bool:
        """Newer Qwen3 templates open <think> in the prompt itself; the output then begins inside it."""
        return self.split_reasoning and rendered_prompt.rstrip().endswith("<think>")

    def tool_tags_are_tokens(self) -> bool:
        """Whether <tool_call> and </tool_call> are single tokens of this tokenizer (Qwen2.5/Qwen3)."""
        return all(self.tokenizer.token_to_id(tag) is not None for tag in (CALL_OPEN, CALL_CLOSE))

    def reasoning_mode(self, rendered_prompt: str) -> str:
        """Where the output's reasoning stands, for the grammar: "none", "open" or "optional"
        (structured_output.build_grammar)."""
        if not self.split_reasoning or rendered_prompt.rstrip().endswith("</think>"):
            return "none"  # no think tokens, or thinking disabled (the prompt closed an empty block)
        return "open" if self.starts_in_reasoning(rendered_prompt) else "optional"

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)


def _open_final_message(rendered: str, final: str) -> str:
    """The rendered conversation cut right after the final message's text, so that the model continues it, as
    transformers' continue_final_message cuts it: at the text's last occurrence, stripped (templates may trim)."""
    text = final.strip()
    at = rendered.rfind(text)
    if not text or at < 0:
        raise invalid("the chat template does not write the final message's text as it is, so it cannot be "
                      "continued", "messages")
    return rendered[:at + len(text)]
