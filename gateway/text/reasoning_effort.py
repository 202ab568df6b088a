"""OpenAI's `reasoning_effort` (chat) and `reasoning.effort` (Responses) as the served model's thinking switch.

Qwen3's chat template has one switch, the `enable_thinking` variable: the template either leaves the think
block open for the model or closes an empty one in the prompt. OpenAI's five efforts map onto it:

    none, minimal        -> enable_thinking: false  (no reasoning, as OpenAI's "none" means)
    low, medium, high    -> enable_thinking: true   (the model reasons; Qwen3 has no budget levels)

The effort itself also reaches the template as `reasoning_effort` (what vLLM passes, and what templates with
levels read). A template that reads neither variable renders as it would without them: a model without a
thinking switch ignores the effort, as OpenAI's non-reasoning models do. A request's own
chat_template_kwargs win over what the effort sets (gateway/openai/parse.py merges them).
"""

from __future__ import annotations

from typing import Any

EFFORTS = ("none", "minimal", "low", "medium", "high")
_THINKING_OFF = frozenset({"none", "minimal"})


def effort_template_kwargs(effort: str | None) -> dict[str, Any]:
    """The chat template variables an effort sets; none when the request gives no effort."""
    if effort is None:
        return {}
    return {"enable_thinking": effort not in _THINKING_OFF, "reasoning_effort": effort}
