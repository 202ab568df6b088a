"""The chat page at `/` and its assets under `/web-ui/`.

The page is a plain client of the public API (/v1/chat/completions, /v1/models, /metrics, /health): it holds
no server-side state and needs no build step. Its files are read once at start from static/ and served from
memory, so a request can only ever name one of them (no path from a request reaches the filesystem).

The page and its assets are the only routes an API-key server serves without a key (`is_public`): they
carry nothing secret, and the page asks for the key before it calls anything else.
"""

from __future__ import annotations

import hashlib
import mimetypes
from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.server.errors import ApiError

STATIC = Path(__file__).parent / "static"
PAGE = "/"
ASSETS = "/web-ui/"
# The model's output is rendered as DOM text by the page's own code; this policy is the second wall: no inline
# script or handler runs, nothing loads from elsewhere, the page cannot be framed.
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated on every load (ETag), so a new server version's page is never mixed with an old cached script.
    "Cache-Control": "no-cache",
}
_THINKING_MARK = "{{thinking}}"  # in index.html's <body data-thinking=...>
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
          ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}


def is_public(method: str, path: str) -> bool:
    """The requests served without an API key: reading the page and its assets (a POST to / is TGI's or TEI's
    route, gateway/huggingface/routes.py, and needs the key as every API route does)."""
    return method in ("GET", "HEAD") and (path == PAGE or path.startswith(ASSETS))


class _Asset:
    def __init__(self, path: Path, body: bytes | None = None):
        self.body = path.read_bytes() if body is None else body
        self.media_type = _TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        self.etag = '"' + hashlib.sha256(self.body).hexdigest()[:16] + '"'

    def response(self, request: Request) -> Response:
        headers = {**_HEADERS, "ETag": self.etag}
        if request.headers.get("if-none-match") == self.etag:
            return Response(status_code=304, headers=headers)
        return Response(self.body, media_type=self.media_type, headers=headers)


def routes(thinking: bool, post: Callable[[Request], Awaitable[Response]]) -> list[Route]:
    """The page's routes, its files read now (a missing file fails the server's start, not a user's load).
    `thinking`: whether the served model reasons in <think> tags, so the page offers its on/off switch. `post`:
    what answers a POST to the page's path (TGI's route there, gateway/huggingface/routes.py): one route for both
    methods, so that a 405 there names them both."""
    assets = {p.name: _Asset(p) for p in sorted(STATIC.iterdir()) if p.is_file() and p.name != "index.html"}
    html = (STATIC / "index.html").read_text()
    if _THINKING_MARK not in html:
        raise RuntimeError(f"{STATIC / 'index.html'} lost the mark {_THINKING_MARK} the server fills in")
    page = _Asset(STATIC / "index.html", html.replace(_THINKING_MARK, "true" if thinking else "false").encode())

    async def index(request: Request) -> Response:
        return await post(request) if request.method == "POST" else page.response(request)

    async def asset(request: Request) -> Response:
        found = assets.get(request.path_params["name"])
        if found is None:
            return ApiError(404, f"no such file: {request.url.path}").response()
        return found.response(request)

    return [Route(PAGE, index, methods=["GET", "POST"]), Route(ASSETS + "{name}", asset, methods=["GET"])]
