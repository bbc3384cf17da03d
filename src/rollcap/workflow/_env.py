"""An evaluation environment: model, resources and agent servers plus a head server, one process.

``environment(...)`` starts them, each on its own port, and the head server, which tells clients
the resolved configuration (credentials removed, ``GET /config``) and every server's name, kind,
type and URL (``GET /servers``). ``rollcap env start`` runs it until interrupted; ``rollcap eval
run`` without ``--no-serve`` runs it around a collection. ``plan_servers`` validates the servers
without starting any; ``rollcap.cluster`` starts the same plan across a Ray cluster.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rollcap._runtime.serving import serving
from rollcap.config import HEADER_READ_TIMEOUT_S, ConfigError, RunSettings, base_urls, redact
from rollcap.gym import (
    AGENTS,
    RESOURCES_SERVERS,
    AgentSettings,
    create_agent_app,
)
from rollcap.gym import create_resources_app as _resources_app
from rollcap.server import ModelServerSettings, create_model_app
from rollcap.status._head import MAX_DOCUMENT_BYTES, HeadStatus, StatusRefused

__all__ = [
    "DEFAULT_HEAD_PORT",
    "AgentPlan",
    "Environment",
    "Instance",
    "ServerInfo",
    "ServerPlan",
    "agent_for",
    "environment",
    "head_app",
    "instances",
    "load_entrypoint",
    "plan_servers",
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


def _head_app(
    config: Mapping[str, Any],
    servers: list[ServerInfo],
    replicas: Callable[[], list[dict[str, str]]] | None = None,
) -> Starlette:
    public_config = orjson.dumps(redact(config))
    status = HeadStatus()

    def server_list() -> list[dict[str, Any]]:
        listed = [asdict(s) for s in servers]
        if replicas is not None:
            live = replicas()
            for server in listed:
                if server["kind"] == "responses_api_models":
                    server["replicas"] = live
                    if live:
                        server["url"] = live[0]["url"]
        return listed

    async def get_config(request: Request) -> Response:
        return Response(public_config, media_type="application/json")

    async def get_servers(request: Request) -> Response:
        return Response(orjson.dumps(server_list()), media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    async def put_status(request: Request) -> Response:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_DOCUMENT_BYTES:
                break
        try:
            status.put(body)
        except StatusRefused as exc:
            return Response(orjson.dumps({"error": str(exc)}), 400, media_type="application/json")
        return Response(status_code=204)

    async def get_status(request: Request) -> Response:
        return Response(
            status.body(), media_type="application/json", headers={"cache-control": "no-store"}
        )

    async def get_metrics(request: Request) -> Response:
        return Response(status.exposition(), headers={"content-type": status.content_type})

    return Starlette(
        routes=[
            Route("/config", get_config, methods=["GET"]),
            Route("/servers", get_servers, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/status", get_status, methods=["GET"]),
            Route("/status", put_status, methods=["PUT"]),
            Route("/metrics", get_metrics, methods=["GET"]),
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


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """One agent server to start: how to build it, and the resources server it grades with."""

    instance: Instance
    create: Callable[[AgentSettings], Any]  # returns a ResponsesAgent
    resources: Instance
    model_name: str | None
    model_server_name: str | None = None  # the model server's name, for the agent's evidence
    # The agent's model calls are training calls (``token_id_capture`` on the agent, or
    # ``token_id_capture.all_agents``): their token ids are staged.
    token_id_capture: bool = False

    def settings(self, model_base_url: str | tuple[str, ...], resources_url: str) -> AgentSettings:
        return AgentSettings(
            model_base_url=model_base_url,
            resources_base_url=resources_url,
            model_name=self.model_name,
            name=self.instance.name,
            model_server_name=self.model_server_name,
            token_id_capture=self.token_id_capture,
            **{k: self.instance.settings[k] for k in ("max_steps",) if k in self.instance.settings},
        )


@dataclass(frozen=True, slots=True)
class ServerPlan:
    """The servers of an environment, validated, nothing built that listens.

    ``resources`` pairs each resources server with the factory of its server object;
    ``model_settings`` are the model server's settings, and ``header_read_timeout_s`` how long
    it waits for a client's request headers.
    """

    config: Mapping[str, Any]
    model: Instance
    model_settings: ModelServerSettings
    resources: tuple[tuple[Instance, Callable[[], Any]], ...]
    agents: tuple[AgentPlan, ...]
    header_read_timeout_s: float = HEADER_READ_TIMEOUT_S

    def agent(self, name: str) -> AgentPlan:
        for plan in self.agents:
            if plan.instance.name == name:
                return plan
        names = ", ".join(p.instance.name for p in self.agents)
        raise ConfigError(f"no agent named {name!r} (agents: {names})")

    def resources_apps(self) -> list[tuple[Instance, Starlette]]:
        """Every resources server's app, built (its factory called), not started."""
        return [(instance, _resources_app(factory())) for instance, factory in self.resources]

    async def serve_resources(
        self,
        stack: contextlib.AsyncExitStack,
        host: str,
        apps: list[tuple[Instance, Starlette]] | None = None,
    ) -> list[ServerInfo]:
        """Start every resources server (``apps``: built already; else built first, so a
        failing factory starts none)."""
        apps = self.resources_apps() if apps is None else apps
        servers = []
        for instance, app in apps:
            url = await stack.enter_async_context(serving(app, host))
            servers.append(ServerInfo(instance.name, instance.kind, instance.type, url))
        return servers

    def agent_app(
        self,
        agent: AgentPlan,
        model_base_url: str | tuple[str, ...],
        resources: list[ServerInfo],
    ) -> Starlette:
        """One agent's app (not started) against the model server(s) and resources servers."""
        resources_url = next(s.url for s in resources if s.name == agent.resources.name)
        app: Starlette = create_agent_app(
            agent.create(agent.settings(model_base_url, resources_url))
        )
        return app

    async def serve_agent(
        self,
        agent: AgentPlan,
        stack: contextlib.AsyncExitStack,
        host: str,
        model_base_url: str | tuple[str, ...],
        resources: list[ServerInfo],
    ) -> ServerInfo:
        """Start one agent server against the model server(s) and the resources servers."""
        app = self.agent_app(agent, model_base_url, resources)
        url = await stack.enter_async_context(serving(app, host))
        return ServerInfo(agent.instance.name, agent.instance.kind, agent.instance.type, url)


def plan_servers(
    config: Mapping[str, Any],
    *,
    model_type: str | None = None,
    resources_server: str | None = None,
    agent: str | None = None,
) -> ServerPlan:
    """Validate the environment's servers (see ``instances``); a bad one is a ``ConfigError``."""
    settings = RunSettings.from_config(config)
    found = instances(config, model_type=model_type, resources_server=resources_server, agent=agent)
    models = [i for i in found if i.kind == "responses_api_models"]
    if len(models) != 1:
        raise ConfigError(
            f"exactly one model server is needed (--model-type or a responses_api_models block), "
            f"got {len(models)}"
        )
    model = models[0]
    model_settings = ModelServerSettings.from_run(
        settings,
        model.type,
        name=model.name,
        base_url=base_urls(
            f"{model.name}.policy_base_url",
            model.settings.get("policy_base_url", settings.policy_base_url),
        ),
        api_key=model.settings.get("policy_api_key", settings.policy_api_key),
    )
    resources = []
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
        resources.append((instance, factory))
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
        resources_instance = _only(
            found, "resources_servers", wanted, "resources_server", instance.name
        )
        model_name = instance.settings.get("model_name", settings.policy_model_name)
        training = instance.settings.get("token_id_capture", False)
        if not isinstance(training, bool):
            raise ConfigError(
                f"{instance.name}: token_id_capture must be true or false, got {training!r}"
            )
        agents.append(
            AgentPlan(
                instance,
                create,
                resources_instance,
                model_name,
                model.name,
                token_id_capture=training or settings.token_capture.all_agents,
            )
        )
    if not agents:
        raise ConfigError("no agent configured (--agent, --resources-server or an agents block)")
    return ServerPlan(
        config,
        model,
        model_settings,
        tuple(resources),
        tuple(agents),
        header_read_timeout_s=settings.header_read_timeout_s,
    )


def head_app(
    config: Mapping[str, Any],
    servers: list[ServerInfo],
    replicas: Callable[[], list[dict[str, str]]] | None = None,
) -> Starlette:
    """The head server: ``GET /config``, ``GET /servers``, ``GET /health``; the collections'
    live status (``PUT /status`` from each, ``GET /status`` for all, ``rollcap.status``) and
    ``GET /metrics`` (their rollouts by count and state, in Prometheus's format).

    ``replicas``: the model server's live replicas (``{"url", "node_id"}``) when it runs as
    several, asked on every ``GET /servers``.
    """
    return _head_app(config, servers, replicas)


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
    plan = plan_servers(
        config, model_type=model_type, resources_server=resources_server, agent=agent
    )
    model = plan.model
    model_app = create_model_app(plan.model_settings)
    resources_apps = plan.resources_apps()
    async with contextlib.AsyncExitStack() as stack:
        model_url = await stack.enter_async_context(
            serving(model_app, host, header_timeout_s=plan.header_read_timeout_s)
        )
        servers = [ServerInfo(model.name, model.kind, model.type, model_url)]
        resources = await plan.serve_resources(stack, host, resources_apps)
        servers += resources
        for agent_plan in plan.agents:
            servers.append(await plan.serve_agent(agent_plan, stack, host, model_url, resources))
        head_url = await stack.enter_async_context(
            serving(_head_app(config, servers), host, head_port)
        )
        yield Environment(head_url, tuple(servers))
