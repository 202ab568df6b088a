"""What TGI's and TEI's request bodies share: strict types with unknown fields ignored (as both servers decode
them), and fields MILI accepts only with the value that means "not used"."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, WithJsonSchema


class HfBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


def _false(value: bool) -> bool:
    if value:
        raise ValueError("not supported")
    return value


# A switch MILI does not serve: false only (strict, so 0 is refused too, which Literal[False] would take).
FalseOnly = Annotated[bool, AfterValidator(_false), WithJsonSchema({"const": False})]
