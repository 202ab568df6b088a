"""The request bodies of POST /v1/embeddings (OpenAI's), /api/embed and /api/embeddings (Ollama's), /v1/rerank and
/rerank (Jina's and Cohere's v1, as vLLM and llama.cpp serve them), /v2/rerank (Cohere's API v2) and /score
(vLLM's), as typed models: strict, unknown fields refused (Ollama's ignored, as Ollama ignores them), bounds from
shared/request_limits.py. What depends on the served model (vocabulary, context, embedding
size) is checked once the texts are tokens (gateway/pooling/prompts.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from gateway.openai.schema import (PRIORITY_DESCRIPTION, MixedPrompt, OllamaBody, OllamaModelName, Priority, TokenId,
                                   _int, _limit, _Model)
from shared.request_limits import (COHERE_TOP_N, COUNT_MAX, DIMENSIONS, MAX_EMBEDDING_INPUTS, MAX_SCORE_DOCUMENTS,
                                   MAX_TOKENS_PER_DOC, TOP_N, TRUNCATE_PROMPT_TOKENS, Range)

Text = Annotated[str, Field(min_length=1)]
TokenIdList = Annotated[list[TokenId], Field(min_length=1)]
# OpenAI's four shapes of `input`; none may be empty, nor hold an empty string or an empty list of ids.
EmbeddingInput = Union[
    Text,
    Annotated[list[Text], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)],
    TokenIdList,
    Annotated[list[TokenIdList], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)],
]
Documents = Annotated[list[Text], Field(min_length=1, max_length=MAX_SCORE_DOCUMENTS)]
# At most the context length (filled in per server); -1: the context length.
TruncatePromptTokens = _int(TRUNCATE_PROMPT_TOKENS, json_schema_extra=_limit("context_tokens"))


# Fields accepted only unset ("not supported by this server" otherwise).
UNSUPPORTED = ("relevant_spans",)


class EmbeddingRequest(_Model):
    input: EmbeddingInput
    model: str | None = None  # None: the served model
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: _int(DIMENSIONS, json_schema_extra=_limit("dimensions")) | None = Field(
        None, description="the first N values, at unit length (Matryoshka), at most the model's embedding size")
    user: str | None = None
    # vLLM's extensions.
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    add_special_tokens: bool = True
    priority: Priority | None = Field(None, description=PRIORITY_DESCRIPTION)


class OllamaEmbedRequest(OllamaBody):
    """Ollama's POST /api/embed. An empty list of inputs is answered with no vectors, as Ollama answers it."""

    model: OllamaModelName
    input: Union[Text, Annotated[list[Text], Field(max_length=MAX_EMBEDDING_INPUTS)]]
    truncate: bool = Field(True, description="cut inputs longer than the context (false: a 400)")
    dimensions: _int(DIMENSIONS, json_schema_extra=_limit("dimensions")) | None = Field(
        None, description="the first N values, at unit length (Matryoshka), at most the model's embedding size")
    options: dict[str, Any] | None = None
    keep_alive: Union[str, float, int, None] = None


class OllamaEmbeddingsRequest(OllamaBody):
    """Ollama's older POST /api/embeddings: one prompt, one vector."""

    model: OllamaModelName
    prompt: Text
    options: dict[str, Any] | None = None
    keep_alive: Union[str, float, int, None] = None


class RerankRequest(_Model):
    query: Text
    documents: Documents
    model: str | None = None
    top_n: _int(TOP_N) | None = None  # None or 0: every document
    return_documents: bool = True
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    # A Qwen3-Reranker's task instruction (its prompt's <Instruct>); vLLM's reranker template takes it by this name.
    instruction: Text | None = None
    priority: Priority | None = Field(None, description=PRIORITY_DESCRIPTION)


# The names vLLM's /score takes for its two sides (its ScoreRequest union: the text_1 / text_2 of its first
# releases, then queries / documents, queries / items and data_1 / data_2); a request names one pair.
SCORE_SIDES = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))
Side = Union[Text, Documents]


def _names_pair(pair: tuple[str, str]) -> dict[str, Any]:
    """JSON Schema: the body gives `pair`'s two sides, and no other side (absent or null)."""
    others = {name for p in SCORE_SIDES for name in p} - set(pair)
    return {"required": list(pair), "properties": {**{name: {"not": {"type": "null"}} for name in pair},
                                                   **{name: {"type": "null"} for name in sorted(others)}}}


class ScoreRequest(_Model):
    """vLLM's /score: the first side against each text of the second (one to one, one to many, or pairwise
    when both are lists), the sides named by one pair of SCORE_SIDES."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [_names_pair(pair) for pair in SCORE_SIDES]})

    text_1: Side | None = None
    text_2: Side | None = None
    queries: Side | None = None
    documents: Side | None = None
    items: Side | None = None
    data_1: Side | None = None
    data_2: Side | None = None
    model: str | None = None
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    instruction: Text | None = None
    priority: Priority | None = Field(None, description=PRIORITY_DESCRIPTION)

    def named_pair(self) -> tuple[str, str] | None:
        """The pair of SCORE_SIDES this request names, and nothing else of them; None if not exactly one."""
        given = {name for pair in SCORE_SIDES for name in pair if getattr(self, name) is not None}
        pairs = [pair for pair in SCORE_SIDES if set(pair) == given]
        return pairs[0] if pairs else None


def _document_text(value: Any) -> Any:
    """Cohere's v1 document object, {"text": ...}, stands for its text; any other object is refused by name."""
    if isinstance(value, dict):
        if set(value) != {"text"}:
            raise ValueError('a document must be a string or a {"text": string} object')
        return value["text"]
    return value


_TEXT_SCHEMA = {"type": "string", "minLength": 1}
CohereDocument = Annotated[Text, BeforeValidator(_document_text), WithJsonSchema({"anyOf": [
    _TEXT_SCHEMA, {"type": "object", "properties": {"text": _TEXT_SCHEMA}, "required": ["text"],
                   "additionalProperties": False}]})]


class CohereRerankRequest(_Model):
    """Cohere's POST /v2/rerank. Documents are cut to `max_tokens_per_doc` tokens (Cohere's default 4096) before
    they are paired with the query; `return_documents` (Cohere's v1 field) adds each result's `document`."""

    model: str | None = None
    query: Text
    documents: Annotated[list[CohereDocument], Field(min_length=1, max_length=MAX_SCORE_DOCUMENTS)]
    top_n: _int(COHERE_TOP_N) | None = None  # None: every document
    max_tokens_per_doc: _int(MAX_TOKENS_PER_DOC) = 4096
    return_documents: bool = False
    instruction: Text | None = None
    priority: Priority | None = Field(None, description=PRIORITY_DESCRIPTION)
    relevant_spans: None = Field(None, description="not supported: the score is the whole document's")


# llama.cpp's prompt shapes: a text, or token ids (texts mixed in: one prompt, as it holds an id).
LlamaPrompt = Union[Text, MixedPrompt]
# ... one of them, or a list of them (several prompts).
LlamaEmbeddingInput = Union[LlamaPrompt,
                            Annotated[list[LlamaPrompt], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]]


class LlamaEmbeddingBody(BaseModel):
    """llama.cpp server's POST /embedding (and /embeddings): `content` or `input` (one of them), one prompt or a
    list of them; unknown fields ignored, as llama-server ignores them."""

    model_config = ConfigDict(extra="ignore", strict=True,
                              json_schema_extra={"oneOf": [{"required": ["content"]}, {"required": ["input"]}]})
    content: LlamaEmbeddingInput = None
    input: LlamaEmbeddingInput = None
    embd_normalize: _int(Range(-1, COUNT_MAX)) = Field(
        2, description="-1: none; 0: scaled so the largest magnitude is 32760 (int16's range); 2 (default): unit "
                       "Euclidean length; p: unit p-norm")
