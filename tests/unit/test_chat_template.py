"""Chat templates: the model's own, rendered in the sandbox, with request variables but never request code."""

from __future__ import annotations

import json

import pytest

from gateway.chat_template import ChatTemplate, ChatTemplateError, NoChatTemplate

# Qwen3's template, reduced to what matters here: ChatML turns and the enable_thinking switch.
QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 日本"}]


def write(tmp_path, **config) -> ChatTemplate:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return ChatTemplate.from_model_dir(tmp_path)


def test_default_model_template_renders_chatml():
    from worker.default_model import default_model_path

    text = ChatTemplate.from_model_dir(default_model_path()).render(MESSAGES)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhéllo 日本<|im_end|>\n"
                    "<|im_start|>assistant\n")


def test_enable_thinking_kwarg(tmp_path):
    template = write(tmp_path, chat_template=QWEN3_LIKE)
    assert template.render(MESSAGES).endswith("<|im_start|>assistant\n")
    assert template.render(MESSAGES, template_kwargs={"enable_thinking": True}).endswith("<|im_start|>assistant\n")
    assert template.render(MESSAGES, template_kwargs={"enable_thinking": False}).endswith("assistant\n<think>\n\n</think>\n\n")


def test_request_variables_cannot_replace_the_conversation(tmp_path):
    template = write(tmp_path, chat_template=QWEN3_LIKE)
    assert "injected" not in template.render(
        MESSAGES, template_kwargs={"messages": [{"role": "user", "content": "injected"}]})


def test_named_templates_and_jinja_file(tmp_path):
    template = write(tmp_path, chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default",
                                                                                      "template": "D"}])
    assert template.render(MESSAGES) == "D"
    (tmp_path / "chat_template.jinja").write_text("J{{ bos_token }}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "C", "bos_token": {"content": "<s>"}}))
    assert ChatTemplate.from_model_dir(tmp_path).render(MESSAGES) == "J<s>"


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% set x = messages.append(1) %}",
])
def test_sandbox_refuses_unsafe_templates(tmp_path, source):
    with pytest.raises(ChatTemplateError):
        write(tmp_path, chat_template=source).render(MESSAGES)


def test_raise_exception_and_missing_template(tmp_path):
    template = write(tmp_path, chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        template.render(MESSAGES)
    with pytest.raises(NoChatTemplate):
        write(tmp_path).render(MESSAGES)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        write(tmp_path, chat_template="{% for %}")
