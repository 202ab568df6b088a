"""API keys: parsing `--api-keys-file`, looking a caller's key up, and the middleware that refuses
everyone else and tells the routes who is calling.

Keys file, one key per line; blank lines and `#` comments are ignored:

    # key                       options (all optional)
    sk-team-a-0123456789        name=team-a  weight=3  max_concurrent=16
    sk-team-b-abcdef            name=team-b
    sk-batch-jobs               weight=0.5   # a comment may follow the options

- `name`: how the key appears in logs, metrics and the scheduler (letters, digits, `.`, `_`, `-`, at
  most 64); the secret itself never does. Default: `key-` and the first 8 hex digits of its SHA-256.
- `weight`: its share when several keys wait for the engine (a number > 0, at most 1000; default 1).
- `max_concurrent`: requests it may have in flight, queued or running (an integer >= 1; default: no limit).

`--api-key` (or MILI_API_KEY) adds one more key named `default` with weight 1 and no limit. Without any
key every caller is the one tenant `anonymous`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.server.errors import ANTHROPIC_VERSION_HEADER, ApiError
from gateway.server.route_aliases import canonical
from shared.request_limits import is_decimal

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_KEY = re.compile(r"[\x21-\x7e]+")  # what can follow "Bearer " in a header: printable ASCII, no spaces
MAX_WEIGHT = 1000.0
SCOPE_KEY = "mili.caller"  # where the middleware leaves the caller's ApiKey in the ASGI scope


@dataclass(frozen=True)
class ApiKey:
    """Who a caller is. Holds no secret: safe to log and to label metrics with."""

    name: str
    weight: float = 1.0
    max_concurrent: int | None = None  # requests in flight (queued + running); None: no limit


ANONYMOUS = ApiKey("anonymous")
DEFAULT_KEY_NAME = "default"


class KeysFileError(ValueError):
    pass


def _default_name(secret: str) -> str:
    return "key-" + hashlib.sha256(secret.encode()).hexdigest()[:8]


def _option(where: str, name: str, value: str) -> float | int | str:
    if name == "name":
        if not _NAME.fullmatch(value):
            raise KeysFileError(f"{where}: name must be 1-64 letters, digits, '.', '_' or '-', got {value!r}")
        return value
    if name == "weight":
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not 0 < weight <= MAX_WEIGHT:
            raise KeysFileError(f"{where}: weight must be a number > 0 and <= {MAX_WEIGHT:g}, got {value!r}")
        return weight
    if name == "max_concurrent":
        if not is_decimal(value) or int(value) < 1:
            raise KeysFileError(f"{where}: max_concurrent must be an integer >= 1, got {value!r}")
        return int(value)
    raise KeysFileError(f"{where}: unknown option {name!r} (known: name, weight, max_concurrent)")


def parse_keys(text: str, source: str) -> dict[str, ApiKey]:
    """A keys file's text -> {secret: ApiKey}. Every error names `source` and the line."""
    keys: dict[str, ApiKey] = {}
    names: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{source} line {number}"
        fields = line.split()
        comment = next((i for i, f in enumerate(fields) if f.startswith("#")), len(fields))
        fields = fields[:comment]
        if not fields:
            continue
        secret, options = fields[0], {}
        if not _KEY.fullmatch(secret):
            raise KeysFileError(f"{where}: a key must be printable ASCII without spaces")
        for field in fields[1:]:
            name, sep, value = field.partition("=")
            if not sep:
                raise KeysFileError(f"{where}: expected OPTION=VALUE after the key, got {field!r}")
            if name in options:
                raise KeysFileError(f"{where}: {name} given twice")
            options[name] = _option(where, name, value)
        key = ApiKey(options.get("name") or _default_name(secret), options.get("weight", 1.0),
                     options.get("max_concurrent"))
        if secret in keys:
            raise KeysFileError(f"{where}: this key is already listed (as {keys[secret].name!r})")
        if key.name in names:
            raise KeysFileError(f"{where}: the name {key.name!r} is already used on line {names[key.name]}")
        keys[secret] = key
        names[key.name] = number
    return keys


def load_keys(api_key: str | None, keys_file: str | None) -> dict[str, ApiKey]:
    """The keys the server accepts, from --api-key and --api-keys-file; {} when neither is given."""
    keys: dict[str, ApiKey] = {}
    if keys_file is not None:
        try:
            text = Path(keys_file).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise KeysFileError(f"--api-keys-file {keys_file}: cannot read it: {e}") from None
        keys = parse_keys(text, keys_file)
        if not keys:
            raise KeysFileError(f"--api-keys-file {keys_file}: no keys in it")
    if api_key:
        if api_key in keys:
            raise KeysFileError(f"--api-key is also listed in --api-keys-file (as {keys[api_key].name!r})")
        if any(k.name == DEFAULT_KEY_NAME for k in keys.values()):
            raise KeysFileError(f"--api-keys-file names a key {DEFAULT_KEY_NAME!r}, the name --api-key's key takes")
        keys[api_key] = ApiKey(DEFAULT_KEY_NAME)
    return keys


class KeyRing:
    """Looks a presented key up by its SHA-256 digest: a dictionary probe on a digest leaks nothing about
    the stored keys through timing, whatever their number."""

    def __init__(self, keys: dict[str, ApiKey]):
        self._by_digest = {hashlib.sha256(secret.encode()).digest(): key for secret, key in keys.items()}
        self.keys = tuple(keys.values())

    @property
    def required(self) -> bool:
        return bool(self._by_digest)

    def lookup(self, authorization: bytes, x_api_key: bytes = b"") -> ApiKey | None:
        """The key of `Authorization: Bearer KEY`, or else of Anthropic's `x-api-key: KEY`."""
        scheme, _, secret = authorization.partition(b" ")
        if scheme != b"Bearer" or not secret:
            secret = x_api_key
        if not secret:
            return None
        return self._by_digest.get(hashlib.sha256(secret).digest())


# Route labels of refused requests: the server's fixed routes, by prefix where a route has a parameter; a
# path the server does not serve is "other" (the label set stays bounded whatever callers send).
_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/models", "/v1/responses", "/v1/embeddings",
           "/v1/rerank", "/v1/streams", "/api", "/metrics", "/version", "/openapi.json", "/debug",
           "/generate", "/generate_stream", "/embed", "/similarity", "/info",  # TGI's and TEI's
           "/completion", "/completions", "/infill", "/props", "/apply-template", "/embedding",
           "/embeddings")  # llama.cpp's
ROUTE_LABELS = (*_ROUTES, "other")


def route_label(path: str) -> str:
    path = canonical(path)
    return next((r for r in _ROUTES if path == r or path.startswith(r + "/")), "other")


class ApiKeyMiddleware:
    """Every route but /health and its alias /v1/health (and the requests `is_public(method, path)` names: reading
    the chat page and its assets) needs `Authorization: Bearer KEY` (or `x-api-key: KEY`) with a known key (when
    any is configured); the caller's ApiKey is left in the scope for the routes (`caller`). Each refusal is reported
    with its route (`on_refused`)."""

    def __init__(self, app, keyring: KeyRing, on_refused: Callable[[str], None] | None = None,
                 is_public: Callable[[str, str], bool] | None = None):
        self.app = app
        self.keyring = keyring
        self.on_refused = on_refused
        self.is_public = is_public

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not self.keyring.required:
            scope[SCOPE_KEY] = ANONYMOUS
        elif canonical(scope["path"]) != "/health" and not (self.is_public and self.is_public(scope["method"],
                                                                                               scope["path"])):
            headers = dict(scope["headers"])
            key = self.keyring.lookup(headers.get(b"authorization", b""), headers.get(b"x-api-key", b""))
            if key is None:
                if self.on_refused is not None:
                    self.on_refused(route_label(scope["path"]))
                response = ApiError(401, "invalid or missing API key (Authorization: Bearer ... or x-api-key)",
                                    code="invalid_api_key").response_for(
                    scope["path"], ANTHROPIC_VERSION_HEADER.encode() in headers)
                return await response(scope, receive, send)
            scope[SCOPE_KEY] = key
        return await self.app(scope, receive, send)


def credentials(request) -> str:
    """What the caller presented as its key (`Authorization`, else `x-api-key`): what a resumable stream's owner
    is known by."""
    return request.headers.get("authorization") or "x-api-key " + request.headers.get("x-api-key", "")


def caller(request) -> ApiKey:
    """The key a request came with (ANONYMOUS on a server without keys)."""
    return request.scope.get(SCOPE_KEY, ANONYMOUS)
