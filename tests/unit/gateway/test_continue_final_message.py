"""A prefill (chat's continue_final_message, Anthropic's final assistant turn): the prompt is the conversation cut
right after the final message's text, as transformers' apply_chat_template(continue_final_message=True) cuts it."""

from __future__ import annotations

import pytest

from gateway.server.errors import ApiError
from gateway.text.served_model_text import ModelText
from tests.unit.gateway.test_chat_template import MESSAGES, QWEN3_LIKE


@pytest.mark.parametrize("template", [None, QWEN3_LIKE])
@pytest.mark.parametrize("prefill", ["The answer is", "  {\"a\": 1", "Sure!\n\nFirst,"])
def test_the_prompt_is_transformers_continuation(template, prefill):
    transformers = pytest.importorskip("transformers")
    from shared.default_model import default_model_path

    text = ModelText(default_model_path(), template)
    conversation = [*MESSAGES, {"role": "assistant", "content": prefill}]
    rendered, ids = text.render_chat(conversation, {}, add_generation_prompt=False, continue_final_message=True)
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(default_model_path()))
    expected = hf.apply_chat_template(conversation, chat_template=template or hf.chat_template, tokenize=False,
                                      continue_final_message=True)
    assert rendered == expected and rendered.endswith(prefill.strip())
    assert ids == text.tokenizer.encode(rendered, add_special_tokens=False).ids


def test_a_template_that_rewrites_the_text_cannot_be_continued(tmp_path):
    from shared.default_model import default_model_path

    shouting = "{% for m in messages %}{{ m['content'] | upper }}\n{% endfor %}"
    text = ModelText(default_model_path(), shouting)
    with pytest.raises(ApiError) as e:
        text.render_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "well"}], {},
                         add_generation_prompt=False, continue_final_message=True)
    assert e.value.status == 400 and "continued" in e.value.message
