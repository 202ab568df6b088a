"""The request bodies of text-embeddings-inference's (TEI's) POST /embed and its dialect of POST /rerank (`texts`, not
`documents`), as typed models: strict types, unknown fields ignored (as TEI ignores them), MILI's bounds
(shared/request_limits.py)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from gateway.huggingface.body import FalseOnly, HfBody
from gateway.openai.schema import TokenId, _int, _limit
from gateway.pooling.schema import Text
from shared.request_limits import DIMENSIONS, MAX_EMBEDDING_INPUTS, MAX_SCORE_DOCUMENTS

# Emptiness is TEI's 400 "Empty", which the routes answer themselves: the document states it (minLength, minItems)
# where validation does not check it.
_NOT_EMPTY_TEXT = {"minLength": 1}
_NOT_EMPTY_LIST = {"minItems": 1}
TeiText = Annotated[str, Field(json_schema_extra=_NOT_EMPTY_TEXT)]
TokenIdList = Annotated[list[TokenId], Field(json_schema_extra=_NOT_EMPTY_LIST)]
Direction = Literal["Right", "Left", "right", "left"]
# TEI's `inputs`: a text, a list of token ids, or a batch of either.
TeiBatch = Annotated[list[Union[TeiText, TokenIdList]],
                     Field(max_length=MAX_EMBEDDING_INPUTS, json_schema_extra=_NOT_EMPTY_LIST)]
TeiInputs = Union[TeiText, TokenIdList, TeiBatch]
TRUNCATE_DESCRIPTION = "cut an input longer than the context (default true, as TEI's --auto-truncate); false: a 422"


class _Truncating(HfBody):
    truncate: bool | None = Field(None, description=TRUNCATE_DESCRIPTION)

    def context_cut(self) -> int | None:
        """PromptBuilder's truncate: -1 (cut at the context) unless the request refused truncation."""
        return None if self.truncate is False else -1


class _Embedding(_Truncating):
    truncation_direction: Direction = Field("Right", description="Left keeps the input's last tokens")
    prompt_name: None = Field(None, description="not supported: the input is embedded as sent")

    def keeps_end(self) -> bool:
        return self.truncation_direction.lower() == "left"


class TeiEmbedBody(_Embedding):
    inputs: TeiInputs
    normalize: bool = Field(True, description="unit length; false: the model's pooled vector as it is (a checkpoint "
                                              "with its own Normalize module normalizes it still)")
    dimensions: _int(DIMENSIONS, json_schema_extra=_limit("dimensions")) | None = Field(
        None, description="the first N values (Matryoshka), at most the model's embedding size")


class TeiRerankBody(_Truncating):
    query: Text
    texts: Annotated[list[TeiText], Field(max_length=MAX_SCORE_DOCUMENTS, json_schema_extra=_NOT_EMPTY_LIST)]
    truncation_direction: Literal["Right", "right"] = Field("Right", description="the document's end is cut")
    raw_scores: FalseOnly = Field(False, description="not supported: scores are probabilities")
    return_text: bool = False


class SimilarityInputs(HfBody):
    source_sentence: TeiText
    sentences: Annotated[list[TeiText], Field(max_length=MAX_EMBEDDING_INPUTS - 1, json_schema_extra=_NOT_EMPTY_LIST)]


class SimilarityParameters(_Embedding):
    pass


class TeiSimilarityBody(HfBody):
    """TEI's /similarity (and huggingface_hub's sentence_similarity): the cosine of the source sentence's embedding
    with each sentence's."""

    inputs: SimilarityInputs
    parameters: SimilarityParameters | None = None
