"""Operator routes (behind the API key like every route but /health).

GET /debug/kv: each worker's KV block ledger (per request: block ids and their reference counts; the
cache's totals; shared blocks; the accounting audit's counters), asked over the worker link and answered
between two engine steps.
POST /debug/kv/fault {"kind": "leak"|"orphan"|"over_free"}: only with --enable-debug-faults; breaks the
block accounting of every worker on purpose, so a drill or a test can watch the audit find, count
(mili_kv_invariant_violations_total) and repair it while serving goes on.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gateway.server.client_io import read_json
from gateway.server.errors import ApiError, invalid
from shared.wire import KV_FAULT_KINDS


async def _ask(request: Request, what: str, arg: str | None = None) -> list[dict]:
    pool = request.app.state.mili.pool
    if not pool.ready_slots:
        raise ApiError(503, "no worker is ready: " + ("; ".join(pool.down_reasons()) or "starting"),
                       code="worker_unavailable", headers={"Retry-After": "5"})
    answers = []
    for index, reply in await pool.query(what, arg):
        if reply is None:
            answers.append({"worker": index, "error": "the worker did not answer"})
        elif reply.error is not None:
            answers.append({"worker": index, "error": reply.error})
        else:
            answers.append({"worker": index, **reply.body})
    return answers


async def kv_ledger(request: Request) -> Response:
    return JSONResponse({"workers": await _ask(request, "kv_ledger")})


async def inject_kv_fault(request: Request) -> Response:
    body = await read_json(request, 4096)
    kind = body.get("kind") if isinstance(body, dict) else None
    if kind not in KV_FAULT_KINDS:
        raise invalid(f"kind must be one of {', '.join(KV_FAULT_KINDS)}", "kind")
    answers = await _ask(request, "inject_kv_fault", kind)
    failed = [a["error"] for a in answers if "error" in a]
    if failed:
        raise ApiError(409, "; ".join(failed), code="fault_not_injected")
    return JSONResponse({"workers": answers})
