"""The Open Inference Protocol's model repository extension: load (or reload) and unload one
model while the gateway serves.

``POST /v2/repository/models/{model}/load`` reads the model's folder in the repository again:
new versions are added, changed ones rebuilt and swapped in once warm, removed ones retired,
unchanged ones left alone (``gateway.model_loading``). ``.../unload`` stops serving every version
of the model; requests already taken are answered first. Both are operator actions: when an
admin token is set they need it (``gateway.http.security``).
"""

from __future__ import annotations

import json
from concurrent.futures import Executor
from pathlib import Path

from aiohttp import web

from gateway.errors import BadRequest, ModelUnavailable
from gateway.model_loading import load_model
from gateway.model_registry import ModelRegistry, VersionStatus

_REGISTRY = web.AppKey("model_registry", ModelRegistry)
_EXECUTOR = web.AppKey("repository_executor", Executor)
_MODEL = "{model:[A-Za-z0-9][A-Za-z0-9_.-]*}"


def add_routes(app: web.Application, registry: ModelRegistry, executor: Executor) -> None:
    app[_REGISTRY] = registry
    app[_EXECUTOR] = executor
    app.router.add_post(f"/v2/repository/models/{_MODEL}/load", load)
    app.router.add_post(f"/v2/repository/models/{_MODEL}/unload", unload)


async def load(request: web.Request) -> web.Response:
    await _check_body(request)
    registry = request.app[_REGISTRY]
    root = _repository(registry)
    statuses = await load_model(registry, root, request.match_info["model"], request.app[_EXECUTOR])
    return _reply(request.match_info["model"], statuses)


async def unload(request: web.Request) -> web.Response:
    await _check_body(request)
    registry = request.app[_REGISTRY]
    name = request.match_info["model"]
    await registry.unload_model(name)
    return _reply(name, [s for s in registry.statuses() if s.name == name])


def _repository(registry: ModelRegistry) -> Path:
    if registry.repository is None:  # a registry given no folder (tests, embedding)
        raise ModelUnavailable("this gateway serves no model repository folder to load from")
    return registry.repository


async def _check_body(request: web.Request) -> None:
    """The extension allows an optional JSON object of parameters; none is used yet, but a body
    that is not an object is refused rather than ignored."""
    body = await request.read()
    if not body.strip():
        return
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest('the body must be a JSON object (e.g. {"parameters": {}}) or empty')


def _reply(name: str, statuses: list[VersionStatus]) -> web.Response:
    return web.json_response(
        {
            "name": name,
            "versions": [
                {
                    "version": str(s.version),
                    "state": s.state,
                    **({"reason": s.reason} if s.reason else {}),
                }
                for s in statuses
            ],
        }
    )
