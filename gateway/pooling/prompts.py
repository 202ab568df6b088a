"""The token ids each pooling request runs: embedding inputs, and (query, document) pairs for scoring.

Texts are tokenized with the tokenizer's own special tokens (`add_special_tokens`, default on): Qwen3-Embedding's
tokenizer appends <|endoftext|>, on which its last-token pooling reads the vector. Token-id inputs run as given.

Past the context an input is a 400 naming its field, unless the client asked for vLLM's `truncate_prompt_tokens`
(-1: the context length): then it keeps its first N tokens, its special tokens added again after the cut, as a
Hugging Face tokenizer's truncation (and so sentence-transformers') does. A pair keeps its query and cuts its
document.

Cohere's `max_tokens_per_doc` cuts each document to its first N tokens before it is paired: the document's text is
cut where its N-th token ends, so the pair is then tokenized as any other (a cut never splits a character).
"""

from __future__ import annotations

from typing import Callable

from tokenizers import Tokenizer

from gateway.pooling.schema import LlamaEmbeddingBody
from gateway.server.errors import CONTEXT_LENGTH_EXCEEDED, ApiError, invalid
from gateway.text.mixed_prompt import mixed_prompt_ids
from shared.pooling_config import PoolingConfig
from shared.request_limits import MAX_EMBEDDING_INPUTS, OutOfBounds, check_prompt_fits, context_length_sentence

# Qwen3-Reranker's documented prompt (its model card's transformers example), byte for byte.
RERANKER_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
                   'Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n')
RERANKER_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
RERANKER_DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def reranker_body(instruction: str, query: str, document: str) -> str:
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


class PromptBuilder:
    def __init__(self, tokenizer: Tokenizer, config: PoolingConfig, vocab_size: int, context_len: int):
        self.tok = tokenizer
        self.config = config
        self.vocab_size = vocab_size
        self.context_len = context_len

    def _limit(self, truncate: int | None) -> int | None:
        if truncate is None:
            return None
        if truncate > self.context_len:
            raise invalid(f"truncate_prompt_tokens ({truncate}) exceeds this model's context length "
                          f"({self.context_len} tokens)", "truncate_prompt_tokens")
        return self.context_len if truncate == -1 else truncate

    def _checked(self, ids: list[int], param: str) -> list[int]:
        if not ids:
            raise invalid(f"{param}: an input is empty after tokenization", param)
        if len(ids) > self.context_len:
            # OpenAI's code and words for an overflow, which clients (LiteLLM) match, as for generation's prompts.
            raise ApiError(400, f"{context_length_sentence(self.context_len)} However, an input of {param} has "
                                f"{len(ids)} tokens (truncate_prompt_tokens cuts it).", param,
                           code=CONTEXT_LENGTH_EXCEEDED)
        try:
            check_prompt_fits(ids, 0, self.vocab_size, self.context_len)  # the ids' range
        except OutOfBounds as e:
            raise invalid(f"{param}: {e}", param) from None
        return ids

    # ----- embeddings -----
    def embedding_inputs(self, inputs: list[str] | list[list[int]], truncate: int | None,
                         add_special_tokens: bool, keep_end: bool = False) -> list[list[int]]:
        """`keep_end`: a cut keeps the input's last tokens rather than its first (TEI's truncation_direction Left)."""
        limit = self._limit(truncate)
        prompts = []
        for item in inputs:
            if isinstance(item, str):
                enc = self.tok.encode(item, add_special_tokens=False)
                if limit is not None:
                    room = limit - (self.tok.num_special_tokens_to_add(False) if add_special_tokens else 0)
                    enc.truncate(max(room, 0), direction="left" if keep_end else "right")
                ids = self.tok.post_process(enc, None, True).ids if add_special_tokens else enc.ids
            elif limit is not None and len(item) > limit:
                ids = list(item[-limit:] if keep_end else item[:limit])
            else:
                ids = list(item)
            prompts.append(self._checked(ids, "input"))
        return prompts

    # ----- scoring -----
    def pairs(self, queries: list[str], documents: list[str], truncate: int | None,
              instruction: str | None, max_tokens_per_doc: int | None = None) -> list[list[int]]:
        """One prompt per (queries[i], documents[i])."""
        limit = self._limit(truncate)
        if max_tokens_per_doc is not None:
            documents = [self._first_tokens(d, max_tokens_per_doc) for d in documents]
        build = self._reranker_pair if self.config.reranker_prompt else self._classifier_pair
        return [self._checked(build(q, d, limit, instruction), "documents") for q, d in zip(queries, documents)]

    def _first_tokens(self, text: str, n: int) -> str:
        enc = self.tok.encode(text, add_special_tokens=False)
        return text if len(enc.ids) <= n else text[:enc.offsets[n - 1][1]]

    def _reranker_pair(self, query: str, document: str, limit: int | None, instruction: str | None) -> list[int]:
        """Prefix, body and suffix tokenized apart and joined, as the reference does; the body is what is cut."""
        prefix = self.tok.encode(RERANKER_PREFIX, add_special_tokens=False).ids
        suffix = self.tok.encode(RERANKER_SUFFIX, add_special_tokens=False).ids
        body = self.tok.encode(reranker_body(instruction or RERANKER_DEFAULT_INSTRUCTION, query, document),
                               add_special_tokens=False)
        if limit is not None:
            body.truncate(max(limit - len(prefix) - len(suffix), 0))
        return prefix + body.ids + suffix

    def _classifier_pair(self, query: str, document: str, limit: int | None, instruction: str | None) -> list[int]:
        """The tokenizer's own pair encoding (a cross-encoder's input); the document is what is cut."""
        q = self.tok.encode(query, add_special_tokens=False)
        d = self.tok.encode(document, add_special_tokens=False)
        if limit is not None:
            d.truncate(max(limit - len(q.ids) - self.tok.num_special_tokens_to_add(True), 0))
        return self.tok.post_process(q, d, True).ids


def llama_inputs(req: LlamaEmbeddingBody, tokenize: Callable[[str, bool], list[int]]) -> list[str | list[int]]:
    """The body's prompts: texts, and token ids (with any texts mixed in tokenized by `tokenize(text, add_special)`,
    gateway/text/mixed_prompt.py)."""
    if (req.input is None) == (req.content is None):
        raise invalid('one of "content" and "input" must be given, not both' if req.input is not None else
                      '"content" (or "input") must be given', "content")
    given = req.input if req.input is not None else req.content
    if isinstance(given, str) or any(isinstance(part, int) for part in given):
        given = [given]  # one prompt (a list holding an id is one prompt of ids and texts)
    elif len(given) > MAX_EMBEDDING_INPUTS:
        raise invalid(f"at most {MAX_EMBEDDING_INPUTS} prompts per request", "content")
    inputs: list[str | list[int]] = []
    for prompt in given:
        if prompt == "":
            raise invalid("a prompt is empty", "content")
        if isinstance(prompt, list) and not any(isinstance(part, int) for part in prompt):
            raise invalid("a prompt given as a list holds token ids (texts may be mixed in)", "content")
        inputs.append(prompt if isinstance(prompt, str) else mixed_prompt_ids(prompt, tokenize))
    return inputs
