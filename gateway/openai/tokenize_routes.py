"""POST /tokenize and POST /detokenize, as vLLM serves them: a prompt or a conversation counted with the served
model's own tokenizer and chat template (exactly the tokens a completion or chat request would run on, so a
client can budget a context before sending), and token ids turned back into text.

/tokenize takes `prompt` (tokenized as /v1/completions does) or `messages` (rendered as /v1/chat/completions
renders them, tools and chat_template_kwargs included) and answers {count, max_model_len, tokens, token_strs}.
/detokenize takes `tokens` and answers {prompt}. `model` is optional; another name than the served one is a 404.

llama.cpp's server spells the same routes its own way, and its clients post to them: a /tokenize body with
`content` (and no `prompt` or `messages`) is tokenized with llama.cpp's defaults (no BOS unless add_special) and
answered as {tokens: [id, ...]}, or with with_pieces {tokens: [{id, piece}, ...]}, a piece being the token's text
or, where its bytes are not whole UTF-8 (part of a character), the list of those bytes. /detokenize's request is
the same in both; its answer carries the text under both names, vLLM's `prompt` and llama.cpp's `content`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.openai.parse import parse_chat, require_model
from gateway.openai.tokenize_schema import DetokenizeBody, LlamaTokenizeBody, TokenizeChatBody, TokenizePromptBody
from gateway.openai.validation import validate
from gateway.server.client_io import read_json
from gateway.server.errors import invalid
from gateway.text.detokenizer import token_bytes


async def tokenize(request: Request) -> Response:
    state = request.app.state.mili
    raw = await read_json(request, state.settings.max_body_bytes)
    served = state.settings.served_model_names
    if isinstance(raw, dict) and "content" in raw and not {"prompt", "messages"} & raw.keys():
        return _llama_tokenize(state, validate(LlamaTokenizeBody, raw))
    if isinstance(raw, dict) and "messages" in raw:
        body = validate(TokenizeChatBody, raw)
        _, tokens = rendered_chat(state, body)
    else:
        body = validate(TokenizePromptBody, raw)
        _check_model(body.model, served)
        tokens = state.text.tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False).ids
    info = state.pool.info
    token_strs = [state.text.tokenizer.id_to_token(t) for t in tokens] if body.return_token_strs else None
    return JSONResponse({"count": len(tokens), "max_model_len": info.max_model_len if info else None,
                         "tokens": tokens, "token_strs": token_strs})


def rendered_chat(state, body: TokenizeChatBody) -> tuple[str, list[int]]:
    """The conversation's prompt text and token ids, as a chat request with it would run: the same parsing
    (tool_calls' arguments, developer as system, content parts) and the served chat template."""
    served = state.settings.served_model_names
    _check_model(body.model, served)
    fields = body.model_dump(include={"messages", "tools", "chat_template_kwargs", "add_generation_prompt",
                                      "continue_final_message"}, exclude_none=True)
    chat = parse_chat({"model": served[0], **fields}, state.settings.limits)
    return state.text.render_chat(list(chat.messages), chat.template_kwargs, chat.tools, chat.add_generation_prompt,
                                  chat.continue_final_message)


async def detokenize(request: Request) -> Response:
    state = request.app.state.mili
    body = validate(DetokenizeBody, await read_json(request, state.settings.max_body_bytes))
    _check_model(body.model, state.settings.served_model_names)
    info = state.pool.info
    vocab = info.vocab_size if info else state.text.tokenizer.get_vocab_size()
    bad = next((t for t in body.tokens if t >= vocab), None)
    if bad is not None:
        raise invalid(f"token id {bad} is outside the vocabulary (size {vocab})", "tokens")
    text = state.text.decode(body.tokens)
    return JSONResponse({"prompt": text, "content": text})


def _llama_tokenize(state, body: LlamaTokenizeBody) -> Response:
    tokenizer = state.text.tokenizer
    tokens = tokenizer.encode(body.content, add_special_tokens=body.add_special is True).ids
    if not body.with_pieces:
        return JSONResponse({"tokens": tokens})
    return JSONResponse({"tokens": [{"id": t, "piece": _piece(token_bytes(tokenizer, t))} for t in tokens]})


def _piece(data: bytes) -> str | list[int]:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return list(data)


def _check_model(model: str | None, served: tuple[str, ...]) -> None:
    if model is not None:
        require_model(model, served)
