"""Chat templates: the model's own, rendered in the sandbox as transformers renders it, with request
variables but never request code; every failure is a ChatTemplateError with the template's message."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from gateway.text.chat_template import ChatTemplate, ChatTemplateError, NoChatTemplate

# Qwen3's template, reduced to what matters here: ChatML turns, a system turn from tools (tojson),
# earlier reasoning dropped from history, and the enable_thinking switch after the generation prompt;
# indented block tags, which lstrip_blocks must remove.
QWEN3_LIKE = """\
{%- if tools %}
<|im_start|>system
{{ messages[0].content + '\\n\\n' if messages[0].role == 'system' else '' }}# Tools
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
<|im_end|>
{% elif messages[0].role == 'system' %}
<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
    {% if message.role == 'user' %}
<|im_start|>user
{{ message.content }}<|im_end|>
    {% elif message.role == 'assistant' %}
{%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}
<|im_start|>assistant
{{ content }}<|im_end|>
    {% endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}
<think>

</think>

{% endif %}
{%- endif %}
"""
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo 日本"}]
CONVERSATION = [*MESSAGES, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHi!"},
                {"role": "user", "content": "<b>tags</b> & \"quotes\""}]
TOOLS = [{"type": "function", "function": {"name": "météo", "description": "<weather> & more",
                                           "parameters": {"type": "object", "properties": {}}}}]


def write(tmp_path, **config) -> ChatTemplate:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return ChatTemplate.from_model_dir(tmp_path)


@pytest.fixture(scope="module")
def default_model_dir():
    from shared.default_model import default_model_path

    return default_model_path()


def test_default_model_template_renders_chatml(default_model_dir):
    template = ChatTemplate.from_model_dir(default_model_dir)
    assert template.render(MESSAGES) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                         "<|im_start|>user\nhéllo 日本<|im_end|>\n<|im_start|>assistant\n")
    # SmolLM2's template supplies its own system turn when the conversation has none.
    assert template.render(MESSAGES[1:], add_generation_prompt=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nhéllo 日本<|im_end|>\n")


def test_qwen3_style_template_honours_enable_thinking(tmp_path):
    template = write(tmp_path, chat_template=QWEN3_LIKE)
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhéllo 日本<|im_end|>\n<|im_start|>assistant\n"
    assert template.render(MESSAGES) == prompt
    assert template.render(MESSAGES, template_kwargs={"enable_thinking": True}) == prompt
    assert template.render(MESSAGES, template_kwargs={"enable_thinking": False}) == prompt + "<think>\n\n</think>\n\n"


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}, {"tools": TOOLS},
                                    {"tools": TOOLS, "enable_thinking": True}])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_as_transformers_does(default_model_dir, kwargs, add_generation_prompt):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(default_model_dir))
    for source in (hf.chat_template, QWEN3_LIKE):
        expected = hf.apply_chat_template(CONVERSATION, chat_template=source, tokenize=False,
                                          add_generation_prompt=add_generation_prompt, **kwargs)
        ours = ChatTemplate(source, "<|im_start|>", "<|im_end|>").render(
            CONVERSATION, add_generation_prompt=add_generation_prompt, template_kwargs=kwargs)
        assert ours == expected


def test_transformers_helpers(tmp_path):
    template = write(tmp_path, chat_template=(
        "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}|"
        "{{ strftime_now('%Y') }}"))
    text = template.render(MESSAGES, template_kwargs={"tools": [{"name": "météo", "note": "<a> & 'b'"}]})
    one_line, indented, loop, year = text.split("|")
    assert one_line == '[{"name": "météo", "note": "<a> & \'b\'"}]'  # not ASCII-escaped, not HTML-escaped
    assert indented == '{\n  "name": "météo",\n  "note": "<a> & \'b\'"\n}'
    assert loop == "system"
    assert year == str(datetime.now().year)


def test_request_variables_cannot_replace_the_conversation_or_special_tokens(tmp_path):
    template = write(tmp_path, chat_template="{{ bos_token }}{{ messages[0].content }}", bos_token="<s>")
    assert template.render(MESSAGES, template_kwargs={
        "messages": [{"role": "user", "content": "injected"}], "bos_token": "X"}) == "<s>Be brief."


def test_named_templates_and_jinja_file(tmp_path):
    template = write(tmp_path, chat_template=[{"name": "tool_use", "template": "T"}, {"name": "default",
                                                                                      "template": "D"}])
    assert template.render(MESSAGES) == "D"
    with pytest.raises(NoChatTemplate):
        write(tmp_path, chat_template=[{"name": "tool_use", "template": "T"}]).render(MESSAGES)
    # A chat_template.jinja next to tokenizer_config.json wins, as in transformers.
    (tmp_path / "chat_template.jinja").write_text("J{{ bos_token }}{{ eos_token }}")
    template = write(tmp_path, chat_template="C", bos_token={"content": "<s>", "special": True}, eos_token="</s>")
    assert template.render(MESSAGES) == "J<s></s>"


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__init__.__globals__ }}",
    "{% set x = messages.append(1) %}",
    "{{ messages[0].update({'content': 'changed'}) }}",
])
def test_sandbox_refuses_unsafe_templates(tmp_path, source):
    messages = [dict(m) for m in MESSAGES]
    with pytest.raises(ChatTemplateError, match="SecurityError|unsafe|not safely"):
        write(tmp_path, chat_template=source).render(messages)
    assert messages == MESSAGES  # and nothing was executed


def test_an_unsafe_attribute_alone_reads_as_nothing(tmp_path):
    # The sandbox makes it undefined (which prints as "", as in transformers); using it any further raises.
    assert write(tmp_path, chat_template="[{{ raise_exception.__globals__ }}]").render(MESSAGES) == "[]"


def test_template_errors_are_chat_template_errors(tmp_path):
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        write(tmp_path, chat_template="{{ raise_exception('roles must alternate') }}").render(MESSAGES)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        write(tmp_path, chat_template="{% for %}")
    with pytest.raises(ChatTemplateError, match="UndefinedError"):
        write(tmp_path, chat_template="{{ messages[0].missing.deeper }}").render(MESSAGES)
    with pytest.raises(ChatTemplateError, match="ZeroDivisionError"):
        write(tmp_path, chat_template="{{ 1 // 0 }}").render(MESSAGES)


def test_missing_template(tmp_path):
    with pytest.raises(NoChatTemplate, match="no chat template"):
        write(tmp_path).render(MESSAGES)
    with pytest.raises(NoChatTemplate):
        ChatTemplate.from_model_dir(tmp_path / "absent").render(MESSAGES)
    assert issubclass(NoChatTemplate, ChatTemplateError)
