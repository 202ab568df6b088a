"""vLLM's /score body in the OpenAPI document: exactly one pair of sides named (SCORE_SIDES), the others absent or
null, as the route checks (ScoreRequest.named_pair); the document and the check agree on every combination."""

from __future__ import annotations

import itertools

import jsonschema
import pytest

from gateway.openai.parse import Limits
from gateway.openapi import ServedBounds, document
from gateway.pooling.schema import SCORE_SIDES, ScoreRequest

NAMES = sorted({name for pair in SCORE_SIDES for name in pair})


def _validator() -> jsonschema.Draft202012Validator:
    doc = document(ServedBounds(("m",), Limits(), 1000, 256, task="score"))
    return jsonschema.Draft202012Validator({"$ref": "#/components/schemas/ScoreRequest",
                                            "components": doc["components"]})


@pytest.mark.parametrize("given", [c for k in range(0, 4) for c in itertools.combinations(NAMES, k)],
                         ids=lambda given: "+".join(given) or "none")
def test_the_document_names_the_pairs_the_route_takes(given):
    validator = _validator()
    for nulls in (False, True):  # the other sides absent, or present as null
        body = {name: "text" for name in given} | ({name: None for name in NAMES if name not in given} if nulls else {})
        named = ScoreRequest.model_validate(body).named_pair()
        assert validator.is_valid(body) == (named is not None), body
        assert named is None or set(named) == set(given)
