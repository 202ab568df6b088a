"""Which routes a server answers follows its --task: a request for another task's route is a 400 that says which
task this server runs and where its requests go."""

from __future__ import annotations

from gateway.server.errors import ApiError

# task -> the routes that serve it (named in the refusal)
TASK_ROUTES = {"generate": "/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, /api/chat and "
                            "/api/generate",
               "embed": "/v1/embeddings, /api/embed and /api/embeddings",
               "score": "/v1/rerank, /rerank, /v2/rerank and /score"}


def require_task(running: str, needed: str) -> None:
    if running != needed:
        raise ApiError(400, f"this server runs --task {running} (it serves {TASK_ROUTES[running]}); this route needs "
                            f"a server started with --task {needed}", code="wrong_task")
