"""Errors in the shape Hugging Face's servers give them: `{"error": message, "error_type": kind}`, TGI's kinds in
lower case (`validation`, `overloaded`, `generation`), TEI's in Pascal case (`Validation`, `Overloaded`, `Empty`,
`Backend`). Both answer a request they cannot take with 422 where MILI's other APIs say 400."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.server.errors import ApiError

TGI, TEI = "tgi", "tei"
_TGI_KINDS = {422: "validation", 413: "validation", 404: "validation", 429: "overloaded", 503: "unhealthy",
              504: "generation"}
_TEI_KINDS = {400: "Empty", 422: "Validation", 413: "Validation", 404: "Validation", 429: "Overloaded",
              503: "Unhealthy", 504: "Backend"}


def error_body(e: ApiError, dialect: str) -> tuple[dict, int]:
    """The body and status of `e` in `dialect`'s shape. A 400 is TGI's and TEI's 422 (input validation), except
    TEI's own 400, an empty input (code "empty")."""
    status = 400 if dialect == TEI and e.code == "empty" else (422 if e.status == 400 else e.status)
    kinds = _TGI_KINDS if dialect == TGI else _TEI_KINDS
    fallback = "generation" if dialect == TGI else "Backend"
    return {"error": e.message, "error_type": kinds.get(status, fallback)}, status


def error_response(e: ApiError, dialect: str) -> JSONResponse:
    body, status = error_body(e, dialect)
    return JSONResponse(body, status_code=status, headers=e.headers)


def answered_in(dialect: Callable[[Request], str],
                handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """`handler` with its ApiErrors answered in the shape of the dialect the request is in (TGI's on a generating
    server, TEI's on an embedding or scoring one, for the routes both servers have)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e, dialect(request))

    return wrapped


def dialect_of(request: Request) -> str:
    """TGI on a generating server, TEI on a pooling one."""
    return TGI if request.app.state.mili.engine_config.task == "generate" else TEI
