"""Schemathesis hooks for the API schema test (loaded through SCHEMATHESIS_HOOKS).

The OpenAPI document states every rule it can; a few rules compare values across fields, or need the
served tokenizer, in ways JSON Schema cannot (each is in its field's description, and the server answers it
with a 400 naming the field). Generated bodies that break one are left out: they are neither valid nor invalid
by the schema, so no check could judge the answer. A /v1/responses or /v1/messages body is judged as the chat
body it translates into, and so is an Ollama /api/chat or /api/generate body (a raw generate: the completion body).
A llama.cpp /completion or /infill body is judged as the completion it becomes. Everything else the generator makes
is sent as it is, except that generation is capped at 16 tokens (map_case; a valid body stays valid) to keep cases
fast. A negative case whose body the document's own schema accepts is left
out too: the generator failed to make it invalid (seen: a TGI grammar's `type` reported as mutated out of its enum
while still "json"), so accepting it is right.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
from typing import Any

import jsonschema
import schemathesis
from schemathesis import GenerationMode
from schemathesis.core.parameters import ParameterLocation

from gateway.pooling.prompts import RERANKER_DEFAULT_INSTRUCTION, RERANKER_PREFIX, RERANKER_SUFFIX, reranker_body
from gateway.pooling.schema import SCORE_SIDES

CONTEXT = int(os.environ.get("MILI_SCHEMATHESIS_CONTEXT", "512"))
FAST_MAX_TOKENS = 16
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
MESSAGE_TOKENS = 16  # ChatML's markers around a message (and a tool result's <tool_response> tags)
TOOL_INSTRUCTION_TOKENS = 150  # the generic tool instructions (about 110 tokens)
COUNTING = ("/count_tokens", "/input_tokens")  # the routes that count a request's prompt, and run nothing
# Why generated cases were left out, counted (written to MILI_SCHEMATHESIS_DROPPED at exit, when set).
DROPPED: collections.Counter = collections.Counter()


@atexit.register
def _write_dropped() -> None:
    path = os.environ.get("MILI_SCHEMATHESIS_DROPPED")
    if path:
        with open(path, "w") as f:
            json.dump(DROPPED, f)


# Case hooks run in every phase (coverage included), body hooks only in the fuzzing phase.
@schemathesis.hook
def map_case(context, case):
    # Only valid bodies: schemathesis re-judges an edited body, and was seen to judge an invalid one valid.
    # Invalid ones are refused before anything is generated anyway.
    if _positive(case) and isinstance(case.body, dict):
        ollama = case.operation.path in ("/api/chat", "/api/generate")
        if case.operation.path in TGI_PATHS:
            case.body = _tgi_capped(dict(case.body))
        elif case.operation.path in LLAMA_PATHS:
            case.body = _llama_capped(dict(case.body))
        elif not case.operation.path.endswith(COUNTING):  # nothing is generated there
            case.body = _ollama_capped(dict(case.body)) if ollama else _capped(dict(case.body))
        if _stateful(case) and case.operation.path == "/v1/responses":
            # The stateful phase reads back what a POST created; a response made with store: false is not kept
            # (OpenAI's rule, answered 404 later), so there every response is stored and must then be found.
            case.body["store"] = True
    elif case.operation.path in TGI_PATHS and isinstance(case.body, dict):
        # A body invalid only in its framing (a text/plain content type, which the server reads as JSON anyway)
        # runs: without max_new_tokens TGI's default generates up to 1024 tokens, past the response time limit
        # on a busy machine. Adding the bound where none is given leaves the body as valid or invalid as it was.
        case.body = _tgi_capped(dict(case.body), replace_given=False)
    elif case.operation.path in LLAMA_PATHS and isinstance(case.body, dict) and "n_predict" not in case.body:
        case.body = _llama_capped(dict(case.body))  # the same, for llama.cpp's n_predict (by default the context)
    return case


def _negative_only_in_body(case) -> bool:
    """A negative case sent with its operation's own method, whose body is the negative part and every other part
    (path, query, headers) valid: its body alone must make it invalid."""
    meta = case.meta
    if meta is None or meta.generation.mode != GenerationMode.NEGATIVE:
        return False
    if case.method.lower() != case.operation.method.lower():  # an undocumented method is what is invalid
        return False
    body = meta.components.get(ParameterLocation.BODY)
    return body is not None and body.mode.is_negative and not any(
        component.mode.is_negative for location, component in meta.components.items()
        if location != ParameterLocation.BODY)


_BODY_VALIDATORS: dict[tuple[str, str], Any] = {}


def _valid_by_document(case) -> bool:
    """Whether the case's JSON body passes the served document's own schema for its operation (OpenAPI 3.1's
    schemas are JSON Schema 2020-12; the document is the root, so its $refs resolve)."""
    key = (case.operation.method.lower(), case.operation.path)
    if key not in _BODY_VALIDATORS:
        document = case.operation.schema.raw_schema
        content = document["paths"][key[1]][key[0]].get("requestBody", {}).get("content", {})
        if "application/json" not in content:
            _BODY_VALIDATORS[key] = None
        else:
            pointer = "/".join(part.replace("~", "~0").replace("/", "~1") for part in
                               ("paths", key[1], key[0], "requestBody", "content", "application/json", "schema"))
            _BODY_VALIDATORS[key] = jsonschema.Draft202012Validator(
                {**document, "$ref": "#/" + pointer}, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    validator = _BODY_VALIDATORS[key]
    return validator is not None and validator.is_valid(case.body)


def _stateful(case) -> bool:
    meta = getattr(case, "meta", None)
    return meta is not None and meta.phase.name == "stateful"


@schemathesis.hook
def filter_case(context, case) -> bool:
    path, body = case.operation.path, case.body
    if not isinstance(body, dict):
        return True
    if _negative_only_in_body(case) and _valid_by_document(case):
        DROPPED["negative_case_valid"] += 1
        return False
    if path in ("/api/chat", "/api/generate"):  # Ollama's: judged as the chat or completion body it becomes
        body = _ollama_as_openai(path, body)
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    if _embedding_beyond_context(path, body, _is_tei(case)):
        DROPPED["embedding_input_beyond_context"] += 1
        return False
    if _score_sides_unequal(path, body):
        DROPPED["score_sides_unequal"] += 1
        return False
    if _pair_beyond_context(path, body, _is_tei(case)):
        DROPPED["pair_beyond_context"] += 1
        return False
    if path in LLAMA_PATHS:  # llama.cpp's: judged as the completion body it becomes
        body, path = _llama_as_completion(path, body), "/v1/completions"
    if path in TGI_PATHS and not _is_tei(case):  # TGI's: judged as the completion body it becomes
        if _tgi_streams(path, body) and _tgi_parameters(body).get("decoder_input_details") is True:
            DROPPED["decoder_input_details_streamed"] += 1
            return False
        body, path = _tgi_as_completion(body), "/v1/completions"
    if path.endswith(("/responses", "/responses/input_tokens")):
        body = _as_chat(body)  # the chat request it stands for: the same rules hold
        if not body["messages"]:  # only reasoning items: nothing to answer (a 400 naming input)
            DROPPED["input_without_turns"] += 1
            return False
    if "/messages" in path:  # Anthropic's: the conversation as the chat request it translates into
        if _misplaced_block(body):
            DROPPED["misplaced_block"] += 1
            return False
        if _prefill_ends_in_whitespace(body):
            DROPPED["prefill_ends_in_whitespace"] += 1
            return False
        counting = path.endswith("/count_tokens")
        body = _messages_as_chat(body)
        rules = (_unknown_named_tool, _tool_choice_without_tools, _tool_declared_twice) + (
            () if counting else (_chat_beyond_context,))
    elif path.endswith("/input_tokens"):  # nothing is generated: the conversation's rules, not the context's
        rules = (_unknown_named_tool, _tool_declared_twice, _call_arguments_not_json, _constraints_beyond_one,
                 _final_message_not_continuable)
    elif path.endswith(("/tokenize", "/apply-template")):  # nothing is generated: a conversation's own rules
        rules = (_tool_declared_twice, _call_arguments_not_json, _final_message_not_continuable) \
            if "messages" in body else ()
    elif path.endswith(("/chat/completions", "/responses")):
        rules = (_min_tokens_above_max, _chat_beyond_context, _unknown_named_tool, _tool_declared_twice,
                 _call_arguments_not_json, _constraints_beyond_one, _constraint_not_compiling,
                 _final_message_not_continuable)
    elif path.endswith("/completions"):
        rules = (_suffix_without_fim_tokens, _min_tokens_above_max, _prompt_beyond_context, _prompt_without_tokens,
                 _constraints_beyond_one, _constraint_not_compiling)
    else:
        rules = ()
    for broken in rules:
        if broken(body):
            DROPPED[broken.__name__.strip("_")] += 1
            return False
    return True


def _ollama_num_predict(body: dict) -> Any:
    """What generation is bounded by after map_case: num_predict when it is below the cap, else the cap."""
    options = body.get("options")
    value = options.get("num_predict") if isinstance(options, dict) else None
    return value if _integral(value) and 0 < value <= FAST_MAX_TOKENS else FAST_MAX_TOKENS


def _ollama_capped(body: dict) -> dict:
    """Ollama generates to the end of the context unless options.num_predict bounds it: capped as _capped caps."""
    options = body.get("options")
    if options is None or isinstance(options, dict):
        body["options"] = {**(options or {}), "num_predict": _ollama_num_predict(body)}
    return body


def _ollama_as_openai(path: str, body: dict) -> dict:
    """An /api/chat or /api/generate body as the chat (raw generate: completion) body the server translates it into
    (gateway/ollama/to_chat.py), as far as the filters look. One with nothing to generate (Ollama's load) is
    checked as one empty user turn, as the server checks it."""
    high = _ollama_num_predict(body)
    prompt = body.get("prompt")
    suffix = body.get("suffix") if path == "/api/generate" else None
    if path == "/api/generate" and prompt and (body.get("raw") is True or suffix):
        completion = {"prompt": prompt, "max_tokens": high, **({"suffix": suffix} if suffix else {})}
        fmt = body.get("format")
        if fmt == "json" or isinstance(fmt, dict):
            completion["structured_outputs"] = {"json": fmt} if isinstance(fmt, dict) else {"json_object": True}
        return completion
    if path == "/api/chat":
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        turns = [{"role": m.get("role"), "content": m.get("content") or "", "tool_calls": m.get("tool_calls")}
                 for m in messages if isinstance(m, dict)]
    else:
        system = body.get("system")
        turns = ([{"role": "system", "content": system}] if system and prompt else []) + \
            [{"role": "user", "content": prompt or ""}]
    chat = {"messages": turns or [{"role": "user", "content": ""}], "max_tokens": high}
    if path == "/api/chat" and isinstance(body.get("tools"), list):
        chat["tools"] = body["tools"]
    return chat


TGI_PATHS = ("/generate", "/generate_stream", "/")


def _tgi_parameters(body: dict) -> dict:
    parameters = body.get("parameters")
    return parameters if isinstance(parameters, dict) else {}


def _tgi_streams(path: str, body: dict) -> bool:
    return path == "/generate_stream" or (path == "/" and body.get("stream") is True)


def _tgi_capped(body: dict, replace_given: bool = True) -> dict:
    """TGI generates up to 1024 tokens unless max_new_tokens bounds it: capped as _capped caps. Without
    `replace_given`, only a body that gives no bound gets one."""
    parameters = body.get("parameters")
    if parameters is None or isinstance(parameters, dict):
        value = (parameters or {}).get("max_new_tokens")
        bounded = _integral(value) and 0 < value <= FAST_MAX_TOKENS
        if value is None or (replace_given and not bounded):
            body["parameters"] = {**(parameters or {}), "max_new_tokens": FAST_MAX_TOKENS}
    return body


def _tgi_as_completion(body: dict) -> dict:
    """A TGI body as the completion body the server translates it into (gateway/huggingface/tgi_to_completion.py),
    as far as the filters look."""
    parameters = _tgi_parameters(body)
    completion = {"prompt": body.get("inputs"), "max_tokens": parameters.get("max_new_tokens") or FAST_MAX_TOKENS}
    grammar = parameters.get("grammar")
    if isinstance(grammar, dict):
        value = grammar.get("value")
        if grammar.get("type") == "regex":
            completion["structured_outputs"] = {"regex": value}
        elif grammar.get("type") == "json_schema":
            completion["structured_outputs"] = {"json": value.get("schema") if isinstance(value, dict) else value}
        else:
            completion["structured_outputs"] = {"json": value}
    return completion


def _is_tei(case) -> bool:
    """Whether the operation takes TEI's bodies (POST / on an embedding or scoring server), not TGI's."""
    operation = case.operation.schema.raw_schema["paths"][case.operation.path][case.operation.method.lower()]
    return "Tei" in json.dumps(operation.get("requestBody", {}))


def _embedding_beyond_context(path: str, body: dict, tei: bool) -> bool:
    """An embedding input longer than the context on a route that refuses it rather than cutting it (a 400 or TEI's
    422 naming the input): /v1/embeddings without truncate_prompt_tokens, Ollama's /api/embed and TEI's routes with
    truncate false, llama.cpp's /embedding always. The length is the served tokenizer's, special tokens included."""
    if path == "/v1/embeddings" and body.get("truncate_prompt_tokens") is None:
        given, special = body.get("input"), body.get("add_special_tokens", True) is not False
    elif path == "/api/embed" and body.get("truncate") is False:
        given, special = body.get("input"), True
    elif path in ("/embed", "/") and tei and body.get("truncate") is False and not isinstance(body.get("inputs"), dict):
        given, special = body.get("inputs"), True
    elif path in ("/similarity", "/") and tei and isinstance(body.get("inputs"), dict):
        parameters = body.get("parameters") if isinstance(body.get("parameters"), dict) else {}
        inputs = body["inputs"]
        sentences = inputs.get("sentences") if isinstance(inputs.get("sentences"), list) else []
        given, special = [inputs.get("source_sentence"), *sentences], True
        if parameters.get("truncate") is not False:
            return False
    elif path in ("/embedding", "/embeddings"):
        given, special = body.get("input", body.get("content")), True
    else:
        return False
    items = [given] if isinstance(given, str) or (isinstance(given, list) and any(
        isinstance(p, int) for p in given)) else given if isinstance(given, list) else []
    return any(_input_length(item, special) > CONTEXT for item in items)


def _input_length(item: Any, special: bool) -> int:
    if isinstance(item, str):
        return len(_tokenizer().encode(item, add_special_tokens=special).ids)
    if isinstance(item, list):  # token ids, with llama.cpp's texts mixed in
        return sum(_input_length(part, False) if isinstance(part, str) else 1 for part in item)
    return 0


RERANK_PATHS = ("/v1/rerank", "/rerank", "/v2/rerank")


def _score_sides(body: dict) -> tuple[Any, Any] | None:
    """/score's two sides, where the body names exactly one pair of them (the document's rule)."""
    given = {name for pair in SCORE_SIDES for name in pair if body.get(name) is not None}
    pair = next((p for p in SCORE_SIDES if set(p) == given), None)
    return (body[pair[0]], body[pair[1]]) if pair else None


def _score_sides_unequal(path: str, body: dict) -> bool:
    """/score with two lists of different lengths (one text against many is fine): a 400 naming the second side."""
    sides = _score_sides(body) if path in ("/score", "/v1/score") else None
    if sides is None:
        return False
    first, second = sides
    return isinstance(first, list) and len(first) != 1 and len(first) != (len(second) if isinstance(second, list)
                                                                             else 1)


def _pair_beyond_context(path: str, body: dict, tei: bool) -> bool:
    """A (query, document) pair whose prompt is longer than the context, on a request that does not cut it: a 400
    naming the documents. Bounded from above: the larger of the reranker prompt's and a cross-encoder's lengths,
    the instruction at its default's length or its own, whichever is longer."""
    if path in ("/score", "/v1/score"):
        sides = _score_sides(body)
        if sides is None or body.get("truncate_prompt_tokens") is not None:
            return False
        queries, documents = ([s] if isinstance(s, str) else s for s in sides)
    elif path in RERANK_PATHS or (path == "/" and tei):
        texts = body.get("texts") if "texts" in body and "documents" not in body else body.get("documents")
        cut = body.get("truncate") is not False if "texts" in body and "documents" not in body else \
            path != "/v2/rerank" and body.get("truncate_prompt_tokens") is not None
        if cut or not isinstance(texts, list):
            return False
        queries, documents = [body.get("query")], texts
    else:
        return False
    if not (isinstance(queries, list) and isinstance(documents, list)):
        return False
    instruction = body.get("instruction") if isinstance(body.get("instruction"), str) else ""
    frame = len(_tokenizer().encode(RERANKER_FRAME + instruction, add_special_tokens=False).ids)
    texts = [t.get("text") if isinstance(t, dict) else t for t in [*queries, *documents]]
    if not all(isinstance(t, str) for t in texts):
        return False
    longest_query = max(_input_length(q, False) for q in queries if isinstance(q, str)) if queries else 0
    return any(frame + longest_query + _input_length(d.get("text") if isinstance(d, dict) else d, False) > CONTEXT
               for d in documents)


# The reranker prompt's fixed text around a pair, its default instruction included (the hooks bound lengths; the
# rerank tests keep their own copy of the prompt as the oracle).
RERANKER_FRAME = RERANKER_PREFIX + RERANKER_SUFFIX + reranker_body(RERANKER_DEFAULT_INSTRUCTION, "", "")


LLAMA_PATHS = ("/completion", "/completions", "/infill")


def _llama_capped(body: dict) -> dict:
    """llama.cpp's n_predict (-1, its default: to the end of the context) capped as _capped caps."""
    value = body.get("n_predict")
    if not (_integral(value) and 0 < value <= FAST_MAX_TOKENS):
        body["n_predict"] = FAST_MAX_TOKENS
    return body


def _llama_as_completion(path: str, body: dict) -> dict:
    """A llama.cpp /completion or /infill body as the completion body the server translates it into
    (gateway/llamacpp/to_completion.py), as far as the filters look: token ids and texts mixed counted as token
    ids, each text at most a token per byte; an /infill prompt as the token ids the server lays out."""
    prompt = body.get("prompt")
    if path == "/infill":
        prompt = _infill_prompt(body)
    elif isinstance(prompt, list) and any(isinstance(p, str) for p in prompt):
        prompt = [0] * sum(len(json.dumps(p, ensure_ascii=True)) if isinstance(p, str) else 1 for p in prompt)
    value = body.get("n_predict")
    completion = {"prompt": prompt, "max_tokens": value if _integral(value) and value > 0 else FAST_MAX_TOKENS}
    if body.get("grammar"):  # an empty grammar is none
        completion["grammar"] = body["grammar"]
    if body.get("json_schema") is not None:
        completion["json_schema"] = body["json_schema"]
    return completion


def _infill_prompt(body: dict) -> list[int] | None:
    """The token ids /infill runs on (gateway/llamacpp/infill.py cuts its parts to llama-server's budgets, so only
    its whole length is judged here); None where the body's parts are not all text."""
    from gateway.llamacpp.infill import infill_ids
    from gateway.text.fill_in_middle import fim_tokens

    extra = body.get("input_extra", [])
    parts = [body.get("input_prefix"), body.get("input_suffix"), body.get("prompt", "")]
    if not (all(isinstance(p, str) for p in parts) and isinstance(extra, list)
            and all(isinstance(c, dict) and isinstance(c.get("text"), str) and isinstance(c.get("filename", ""), str)
                    for c in extra)):
        return None
    chunks = [(c.get("filename", "tmp"), c["text"]) for c in extra]
    value = body.get("n_predict")
    return infill_ids(_tokenizer(), fim_tokens(_tokenizer()), *parts, chunks, CONTEXT,
                      value if _integral(value) else -1)


def _positive(case) -> bool:
    meta = case.meta
    return meta is not None and meta.generation.mode == GenerationMode.POSITIVE


def _capped(body: Any) -> Any:
    """Generation capped at FAST_MAX_TOKENS (chat asks for it when the body names no limit, as it would
    otherwise run to the end of the context); min_tokens follows it down. Valid values stay valid."""
    if not isinstance(body, dict):
        return body
    if "messages" in body and "max_tokens" not in body and "max_completion_tokens" not in body:
        body["max_completion_tokens"] = FAST_MAX_TOKENS
    if "input" in body and body.get("max_output_tokens") is None:
        body["max_output_tokens"] = FAST_MAX_TOKENS
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = body.get(field)
        if _integral(value) and FAST_MAX_TOKENS < value < CONTEXT:
            body[field] = FAST_MAX_TOKENS
    low, high = body.get("min_tokens"), _max_tokens(body)
    if _integral(low) and _integral(high) and 0 <= high < low:
        body["min_tokens"] = high
    return body


def _integral(value: Any) -> bool:
    """An integer as JSON (and the server) reads numbers: 4 and 4.0 alike."""
    return type(value) is int or (type(value) is float and value.is_integer())


def _max_tokens(body: dict) -> Any:
    if "prompt" in body:  # completions
        return COMPLETIONS_DEFAULT_MAX_TOKENS if body.get("max_tokens") is None else body["max_tokens"]
    return body.get("max_completion_tokens") if body.get("max_completion_tokens") is not None \
        else body.get("max_tokens")


def _min_tokens_above_max(body: dict) -> bool:
    low, high = body.get("min_tokens"), _max_tokens(body)
    return _integral(low) and _integral(high) and low > high


def _prompt_beyond_context(body: dict) -> bool:
    prompt, high = body.get("prompt"), _max_tokens(body)
    if isinstance(prompt, str):
        prompt = [prompt]
    if not (isinstance(prompt, list) and prompt and _integral(high)):
        return False
    prompts = prompt if isinstance(prompt[0], (list, str)) else [prompt]
    # Token ids count as they are; text at most one token per byte (see _chat_beyond_context).
    lengths = [len(p) if isinstance(p, list) else len(json.dumps(p, ensure_ascii=True)) for p in prompts]
    return any(n + high > CONTEXT or (n == CONTEXT and high != 0) for n in lengths)


def _suffix_without_fim_tokens(body: dict) -> bool:
    """A suffix (fill in the middle) to a model whose tokenizer has no fill-in-the-middle tokens: a 400 naming it,
    by the rule its description states."""
    from gateway.text.fill_in_middle import fim_tokens

    suffix = body.get("suffix")
    return isinstance(suffix, str) and bool(suffix) and fim_tokens(_tokenizer()) is None


def _prompt_without_tokens(body: dict) -> bool:
    """A text prompt the served tokenizer turns into no token at all (control characters it drops, say): there
    is nothing to continue, and the server says so with a 400 naming `prompt`."""
    prompt = body.get("prompt")
    texts = [prompt] if isinstance(prompt, str) else prompt if isinstance(prompt, list) else []
    return any(isinstance(t, str) and not _tokenizer().encode(t, add_special_tokens=True).ids for t in texts)


_TOKENIZER = []


def _tokenizer():
    """The served model's tokenizer (MILI_SCHEMATHESIS_TOKENIZER), loaded once."""
    if not _TOKENIZER:
        from tokenizers import Tokenizer

        _TOKENIZER.append(Tokenizer.from_file(os.environ["MILI_SCHEMATHESIS_TOKENIZER"]))
    return _TOKENIZER[0]


def _chat_beyond_context(body: dict) -> bool:
    """The rendered prompt's length, bounded from above without the tokenizer: a byte-level BPE token covers
    at least one UTF-8 byte, and JSON with ASCII escapes spends at least one character per byte. Each message
    adds its role markers (under MESSAGE_TOKENS); tools are described as JSON after fixed instructions."""
    high = _max_tokens(body)
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    size = sum(MESSAGE_TOKENS + sum(len(json.dumps(m.get(k), ensure_ascii=True)) for k in ("content", "name",
                                                                                           "tool_calls"))
               for m in messages if isinstance(m, dict))
    if body.get("tools"):
        size += TOOL_INSTRUCTION_TOKENS + len(json.dumps(body["tools"], ensure_ascii=True))
    return size + (high if _integral(high) else CONTEXT) > CONTEXT


def _names(body: dict) -> list:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    return [t["function"].get("name") for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)]


def _unknown_named_tool(body: dict) -> bool:
    choice = body.get("tool_choice")
    if not (isinstance(choice, dict) and isinstance(choice.get("function"), dict)):
        return False
    return choice["function"].get("name") not in _names(body)


def _tool_declared_twice(body: dict) -> bool:
    names = _names(body)
    return len(names) != len(set(map(str, names)))


def _call_arguments_not_json(body: dict) -> bool:
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                try:
                    json.loads(arguments)
                except ValueError:
                    return True
    return False


def _as_chat(body: dict) -> dict:
    """A /v1/responses body as the chat body the server translates it into (gateway/responses_api/to_chat.py), as far
    as the filters look: messages with their text, calls and results; tools and a named tool_choice nested as
    chat nests them; max_output_tokens as max_completion_tokens."""
    items = body.get("input")
    items = [{"role": "user", "content": items}] if isinstance(items, str) else items if isinstance(items, list) else []
    instructions = body.get("instructions")
    messages = [{"role": "system", "content": instructions}] if isinstance(instructions, str) else []
    for item in items:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            call = {"id": item.get("call_id"), "function": {"name": item.get("name"),
                                                            "arguments": item.get("arguments")}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif item.get("type") == "function_call_output":
            messages.append({"role": "tool", "content": item.get("output")})
        elif item.get("type") in (None, "message"):
            messages.append({"role": item.get("role"), "content": item.get("content")})
    chat = {"messages": messages, "max_completion_tokens": body.get("max_output_tokens")}
    if isinstance(body.get("tools"), list):
        # A namespace's functions are offered beside the others; hosted tools are not offered.
        functions = [inner for t in body["tools"] for inner in _offered(t)]
        if functions or not body["tools"]:
            chat["tools"] = [{"type": "function", "function": t} for t in functions]
    choice = body.get("tool_choice")
    chat["tool_choice"] = {"function": {"name": choice.get("name")}} if isinstance(choice, dict) else choice
    return chat


def _offered(tool: Any) -> list[dict]:
    """The functions a Responses tool offers the model: itself, a namespace's functions, or none (hosted tools)."""
    if not isinstance(tool, dict):
        return []
    inner = tool.get("tools") if tool.get("type") == "namespace" else [tool]
    return [t for t in inner if isinstance(t, dict) and t.get("type") == "function"] if isinstance(inner, list) else []


# Output constraints (gateway/text/output_constraints.py): top-level fields and structured_outputs' keys.
CONSTRAINT_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                     "guided_grammar": "grammar", "grammar": "grammar", "json_schema": "json"}


def _constraints(body: dict) -> list[tuple[str, Any]]:
    """(kind, value) of each output constraint the body gives."""
    given = [(kind, body[name]) for name, kind in CONSTRAINT_FIELDS.items() if body.get(name) is not None]
    nested = body.get("structured_outputs")
    if isinstance(nested, dict):
        given += [(kind, nested[kind]) for kind in ("json", "regex", "choice", "grammar", "json_object")
                  if nested.get(kind) not in (None, False)]
    return given


def _constraints_beyond_one(body: dict) -> bool:
    """One constraint per request: response_format (other than text) and tools the model may call count too."""
    fmt = body.get("response_format")
    others = int(isinstance(fmt, dict) and fmt.get("type") not in (None, "text"))
    others += int(bool(body.get("tools")) and body.get("tool_choice") != "none")
    return len(_constraints(body)) + others > 1


def _constraint_not_compiling(body: dict) -> bool:
    """A regex or grammar llguidance does not compile, text that no output can match (lone surrogates), or a
    JSON schema given as text that is not a JSON object."""
    import llguidance

    for kind, value in _constraints(body):
        if not _encodes(json.dumps(value, ensure_ascii=False)):
            return True
        if kind == "json" and isinstance(value, str):
            try:
                if not isinstance(json.loads(value), dict):
                    return True
            except ValueError:
                return True
        if kind in ("regex", "grammar") and isinstance(value, str):
            try:
                grammar = llguidance.grammar_from(kind, value)
            except Exception:  # the GBNF converter raises several types
                return True
            if llguidance.LLMatcher.validate_grammar_with_warnings(grammar, _ll_tokenizer())[0]:
                return True
    return False


# Blocks a text-only server refuses (image, a PDF document, ...), and tool blocks in the wrong role's turn: 400s
# naming the block, by the rule the Messages schema's description states.
_SERVED_BLOCKS = {"user": {"text", "document", "search_result", "tool_result", "thinking", "redacted_thinking"},
                  "assistant": {"text", "tool_use", "thinking", "redacted_thinking"},
                  "system": {"text", "thinking", "redacted_thinking"}}


def _final_message_not_continuable(body: dict) -> bool:
    """continue_final_message with a last message that is not an assistant's text without tool_calls (a 400 naming
    it, by the rule the field's description states)."""
    if body.get("continue_final_message") is not True:
        return False
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    content = last.get("content")
    text = content if isinstance(content, str) else "\n".join(
        p.get("text", "") for p in content if isinstance(p, dict)) if isinstance(content, list) else ""
    return last.get("role") != "assistant" or bool(last.get("tool_calls")) or not text.strip()


def _prefill_ends_in_whitespace(body: dict) -> bool:
    """A final assistant turn (a prefill) whose text ends in whitespace: a 400, as Anthropic's API answers it."""
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
    if last.get("role") != "assistant":
        return False
    content = last.get("content")
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else \
        content if isinstance(content, list) else []
    blocks = [b for b in blocks if isinstance(b, dict)]
    if any(b.get("type") == "tool_use" for b in blocks):
        return False
    text = "\n".join(b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str))
    return bool(text) and text != text.rstrip()


def _misplaced_block(body: dict) -> bool:
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            kind, role = block.get("type"), message.get("role")
            if isinstance(kind, str) and isinstance(role, str) and kind not in _SERVED_BLOCKS.get(role, {kind}):
                return True
            if _unread_document(block):
                return True
            inner = block.get("content") if block.get("type") == "tool_result" else None
            if isinstance(inner, list) and any(isinstance(p, dict) and (
                    p.get("type") not in ("text", "document", "search_result") or _unread_document(p)) for p in inner):
                return True
    return False


def _unread_document(block: dict) -> bool:
    """A document or search result block the server refuses by name: citations on, a PDF, URL or file source, or an
    image inside a content source (the block schemas' descriptions state each)."""
    if block.get("type") not in ("document", "search_result"):
        return False
    citations = block.get("citations")
    if isinstance(citations, dict) and citations.get("enabled"):
        return True
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    if source.get("type") in ("base64", "url", "file"):
        return True
    content = source.get("content") if source.get("type") == "content" else None
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") != "text" for p in content)


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


_LL_TOKENIZER = []


def _ll_tokenizer():
    if not _LL_TOKENIZER:
        import llguidance

        tok = _tokenizer()
        _LL_TOKENIZER.append(llguidance.LLTokenizer(tok.to_str(), n_vocab=tok.get_vocab_size()))
    return _LL_TOKENIZER[0]


def _tool_choice_without_tools(body: dict) -> bool:
    return body.get("tool_choice") == "required" and not body.get("tools")


def _messages_as_chat(body: dict) -> dict:
    """A /v1/messages body as the chat body the server translates it into (gateway/anthropic/to_chat.py), as far
    as the filters look: the system prompt and turns with their text, calls and results; tools and tool_choice
    nested as chat nests them."""
    system = body.get("system")
    messages = [{"role": "system", "content": system}] if system else []
    for message in body.get("messages") if isinstance(body.get("messages"), list) else []:
        if isinstance(message, dict):
            messages.append({"role": message.get("role"), "content": message.get("content")})
    chat = {"messages": messages, "max_tokens": body.get("max_tokens")}
    if isinstance(body.get("tools"), list):
        chat["tools"] = [{"type": "function", "function": {**t, "parameters": t.get("input_schema")}}
                         for t in body["tools"] if isinstance(t, dict)]
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    chat["tool_choice"] = ({"function": {"name": choice.get("name")}} if kind == "tool"
                           else "required" if kind == "any" else kind)
    return chat
