"""An evaluation environment: model, resources and agent servers plus a head server, one process.

``environment(...)`` starts them, each on its own port, and the head server, which tells clients
the resolved configuration (credentials removed, ``GET /config``) and every server's name, kind,
type and URL (``GET /servers``). ``rollcap env start`` runs it until interrupted; ``rollcap eval
run`` without ``--no-serve`` runs it around a collection.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._runtime.serving import serving
from rollcap.config import ConfigError, RunSettings, base_urls, redact
from rollcap.gym import AGENTS, RESOURCES_SERVERS, AgentSettings, create_agent_app
from rollcap.gym import create_resources_app as _resources_app
from rollcap.server import ModelServerSettings, create_model_app

__all__ = [
    "DEFAULT_HEAD_PORT",
    "Environment",
    "Instance",
    "ServerInfo",
    "agent_for",
    "environment",
    "instances",
    "load_entrypoint",
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


KINDS = ("responses_api_models", "resources_servers", "responses_api_agents")


@dataclass(frozen=True, slots=True)
class Instance:
    """One server as configured: ``<name>: {<kind>: {<type>: {settings}}}``."""

    name: str
    kind: str
    type: str
    settings: Mapping[str, Any]


def instances(
    config: Mapping[str, Any],
    *,
    model_type: str | None = None,
    resources_server: str | None = None,
    agent: str | None = None,
) -> list[Instance]:
    """The server blocks of ``config``, plus those the command-line shorthands add.

    ``--model-type T`` adds ``policy_model: {responses_api_models: {T: {}}}``,
    ``--resources-server R`` adds ``R: {resources_servers: {R: {}}}`` and, unless an agent is
    configured, R's built-in agent; ``--agent A`` adds ``A: {responses_api_agents: {A: {}}}``.
    """
    found: list[Instance] = []
    for name, block in config.items():
        if not (isinstance(block, Mapping) and len(block) == 1 and next(iter(block)) in KINDS):
            continue
        kind, inner = next(iter(block.items()))
        if not isinstance(inner, Mapping) or len(inner) != 1:
            raise ConfigError(
                f"{name}.{kind} must name exactly one type: {name}: {{{kind}: {{TYPE: {{...}}}}}}"
            )
        type_, settings = next(iter(inner.items()))
        if settings is None:
            settings = {}
        if not isinstance(settings, Mapping):
            raise ConfigError(f"{name}.{kind}.{type_} must be a mapping of settings")
        found.append(Instance(str(name), str(kind), str(type_), settings))
    names = {i.name for i in found}

    def add(instance: Instance) -> None:
        if instance.name not in names:
            found.append(instance)
            names.add(instance.name)

    if model_type is not None:
        add(Instance(MODEL_SERVER_NAME, "responses_api_models", model_type, {}))
    if resources_server is not None:
        add(Instance(resources_server, "resources_servers", resources_server, {}))
    if agent is not None:
        add(Instance(agent, "responses_api_agents", agent, {}))
    elif resources_server is not None and not any(i.kind == "responses_api_agents" for i in found):
        name = agent_for(resources_server)
        add(Instance(name, "responses_api_agents", name, {}))
    return found


def load_entrypoint(spec: object, where: str) -> Any:
    """``module:attribute`` or ``path/to/file.py:attribute``, loaded."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(
            f"{where}.entrypoint must look like module:attribute or file.py:attribute"
        )
    target, _, attribute = spec.rpartition(":")
    try:
        if target.endswith(".py"):
            path = Path(target).resolve()
            module_spec = importlib.util.spec_from_file_location(f"rollcap_user_{path.stem}", path)
            if module_spec is None or module_spec.loader is None:
                raise ConfigError(f"{where}.entrypoint: cannot load {target}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except (ImportError, OSError, SyntaxError) as exc:
        raise ConfigError(f"{where}.entrypoint {spec!r}: {type(exc).__name__}: {exc}") from None
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigError(f"{where}.entrypoint {spec!r}: no attribute {attribute!r}") from None


def _only(found: list[Instance], kind: str, wanted: object, role: str, owner: str) -> Instance:
    of_kind = [i for i in found if i.kind == kind]
    if wanted is not None:
        for instance in of_kind:
            if instance.name == wanted:
                return instance
        raise ConfigError(f"{owner}: {role} {wanted!r} is not a configured {kind} server")
    if len(of_kind) != 1:
        raise ConfigError(
            f"{owner}: name its {role} (one of: {', '.join(i.name for i in of_kind)})"
        )
    return of_kind[0]


@contextlib.asynccontextmanager
async def environment(
    config: Mapping[str, Any],
    *,
    model_type: str | None = None,
    resources_server: str | None = None,
    agent: str | None = None,
    host: str = "127.0.0.1",
    head_port: int = DEFAULT_HEAD_PORT,
) -> AsyncIterator[Environment]:
    """Start the configured model, resources and agent servers and the head server.

    Ports are chosen by the system, except the head server's. Everything is validated and
    built before anything starts, so a bad configuration starts nothing.
    """
    settings = RunSettings.from_config(config)
    found = instances(config, model_type=model_type, resources_server=resources_server, agent=agent)
    models = [i for i in found if i.kind == "responses_api_models"]
    if len(models) != 1:
        raise ConfigError(
            f"exactly one model server is needed (--model-type or a responses_api_models block), "
            f"got {len(models)}"
        )
    model = models[0]
    model_app = create_model_app(
        ModelServerSettings(
            model_type=model.type,
            base_url=base_urls(
                f"{model.name}.policy_base_url",
                model.settings.get("policy_base_url", settings.policy_base_url),
            ),
            api_key=model.settings.get("policy_api_key", settings.policy_api_key),
            name=model.name,
            capture_dir=settings.capture_dir,
            pass_client_credentials=settings.pass_client_credentials,
            external_staging=settings.external_staging,
            ledger_dir=settings.token_ledger_dir,
        )
    )
    resources_apps = []
    for instance in (i for i in found if i.kind == "resources_servers"):
        where = f"{instance.name}.resources_servers.{instance.type}"
        if "entrypoint" in instance.settings:
            factory = load_entrypoint(instance.settings["entrypoint"], where)
        elif instance.type in RESOURCES_SERVERS:
            factory = RESOURCES_SERVERS[instance.type]
        else:
            raise ConfigError(
                f"unknown resources server {instance.type!r}: expected one of "
                f"{', '.join(RESOURCES_SERVERS)}, or an entrypoint"
            )
        resources_apps.append((instance, _resources_app(factory())))
    agents = []
    for instance in (i for i in found if i.kind == "responses_api_agents"):
        where = f"{instance.name}.responses_api_agents.{instance.type}"
        if "entrypoint" in instance.settings:
            create = load_entrypoint(instance.settings["entrypoint"], where)
            default_resources = None
        elif instance.type in AGENTS:
            create = AGENTS[instance.type].create
            default_resources = AGENTS[instance.type].resources_server
        else:
            raise ConfigError(
                f"unknown agent {instance.type!r}: expected one of {', '.join(AGENTS)}, "
                "or an entrypoint"
            )
        wanted = instance.settings.get("resources_server")
        names = {i.name for i in found if i.kind == "resources_servers"}
        if wanted is None and default_resources in names:
            wanted = default_resources
        resources = _only(found, "resources_servers", wanted, "resources_server", instance.name)
        agents.append((instance, create, resources))
    if not agents:
        raise ConfigError("no agent configured (--agent, --resources-server or an agents block)")

    servers: list[ServerInfo] = []
    urls: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        urls[model.name] = await stack.enter_async_context(serving(model_app, host))
        servers.append(ServerInfo(model.name, model.kind, model.type, urls[model.name]))
        for instance, app in resources_apps:
            urls[instance.name] = await stack.enter_async_context(serving(app, host))
            servers.append(
                ServerInfo(instance.name, instance.kind, instance.type, urls[instance.name])
            )
        for instance, create, resources in agents:
            agent_settings = AgentSettings(
                model_base_url=urls[model.name],
                resources_base_url=urls[resources.name],
                model_name=instance.settings.get("model_name", settings.policy_model_name),
                name=instance.name,
            )
            url = await stack.enter_async_context(
                serving(create_agent_app(create(agent_settings)), host)
            )
            servers.append(ServerInfo(instance.name, instance.kind, instance.type, url))
        head_url = await stack.enter_async_context(
            serving(_head_app(config, servers), host, head_port)
        )
        yield Environment(head_url, tuple(servers))
