"""An evaluation environment: model, resources and agent servers plus a head server, one process.

``environment(...)`` starts them, each on its own port, and the head server, which tells clients
the resolved configuration (credentials removed, ``GET /config``) and every server's name, kind,
type and URL (``GET /servers``). ``rollcap env start`` runs it until interrupted; ``rollcap eval
run`` without ``--no-serve`` runs it around a collection.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._serving import serving
from rollcap.config import ConfigError, RunSettings, redact
from rollcap.gym import AGENTS, RESOURCES_SERVERS, AgentSettings, create_agent_app
from rollcap.gym import create_resources_app as _resources_app
from rollcap.server import ModelServerSettings, create_model_app

__all__ = [
    "DEFAULT_HEAD_PORT",
    "Environment",
    "ServerInfo",
    "agent_for",
    "environment",
]

DEFAULT_HEAD_PORT = 11000
MODEL_SERVER_NAME = "policy_model"


@dataclass(frozen=True, slots=True)
class ServerInfo:
    name: str
    kind: str  # responses_api_models | resources_servers | responses_api_agents
    type: str
    url: str


@dataclass(frozen=True, slots=True)
class Environment:
    head_url: str
    servers: tuple[ServerInfo, ...]

    def url_of(self, name: str) -> str:
        for server in self.servers:
            if server.name == name:
                return server.url
        raise ValueError(f"no server named {name!r}: have {', '.join(self.names())}")

    def names(self) -> list[str]:
        return [server.name for server in self.servers]


def agent_for(resources_server: str) -> str:
    """The built-in agent that goes with a resources server."""
    if resources_server not in RESOURCES_SERVERS:
        raise ConfigError(
            f"unknown resources server {resources_server!r}: "
            f"expected one of {', '.join(RESOURCES_SERVERS)}"
        )
    for name, spec in AGENTS.items():
        if spec.resources_server == resources_server:
            return name
    raise ConfigError(f"no built-in agent for resources server {resources_server!r}")


def _head_app(config: Mapping[str, Any], servers: list[ServerInfo]) -> Starlette:
    public_config = orjson.dumps(redact(config))

    async def get_config(request: Request) -> Response:
        return Response(public_config, media_type="application/json")

    async def get_servers(request: Request) -> Response:
        return Response(orjson.dumps([asdict(s) for s in servers]), media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    return Starlette(
        routes=[
            Route("/config", get_config, methods=["GET"]),
            Route("/servers", get_servers, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


@contextlib.asynccontextmanager
async def environment(
    config: Mapping[str, Any],
    *,
    model_type: str,
    resources_server: str,
    agent: str | None = None,
    host: str = "127.0.0.1",
    head_port: int = DEFAULT_HEAD_PORT,
) -> AsyncIterator[Environment]:
    """Start the model, resources and agent servers and the head server; stop them on exit.

    Ports are chosen by the system, except the head server's. Everything is validated before
    anything starts, so a bad configuration starts nothing.
    """
    settings = RunSettings.from_config(config)
    agent = agent or agent_for(resources_server)
    if agent not in AGENTS:
        raise ConfigError(f"unknown agent {agent!r}: expected one of {', '.join(AGENTS)}")
    if resources_server not in RESOURCES_SERVERS:
        agent_for(resources_server)  # raises the clear error
    model_app = create_model_app(
        ModelServerSettings(
            model_type=model_type,
            base_url=settings.policy_base_url,
            api_key=settings.policy_api_key,
            name=MODEL_SERVER_NAME,
            capture_dir=settings.capture_dir,
            pass_client_credentials=settings.pass_client_credentials,
        )
    )
    servers: list[ServerInfo] = []
    async with contextlib.AsyncExitStack() as stack:
        model_url = await stack.enter_async_context(serving(model_app, host))
        servers.append(ServerInfo(MODEL_SERVER_NAME, "responses_api_models", model_type, model_url))
        resources_url = await stack.enter_async_context(
            serving(_resources_app(RESOURCES_SERVERS[resources_server]()), host)
        )
        servers.append(
            ServerInfo(resources_server, "resources_servers", resources_server, resources_url)
        )
        agent_settings = AgentSettings(
            model_base_url=model_url,
            resources_base_url=resources_url,
            model_name=settings.policy_model_name,
            name=agent,
        )
        agent_url = await stack.enter_async_context(
            serving(create_agent_app(AGENTS[agent].create(agent_settings)), host)
        )
        servers.append(ServerInfo(agent, "responses_api_agents", agent, agent_url))
        head_url = await stack.enter_async_context(
            serving(_head_app(config, servers), host, head_port)
        )
        yield Environment(head_url, tuple(servers))
