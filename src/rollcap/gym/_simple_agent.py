"""The simple agent: Responses calls and the resources server's tools, in a loop, then verify.

``SimpleResponsesAgent.run`` takes one task line (``responses_create_params`` plus the run's
indices) and:

1. takes the tools: the request's own ``tools``, else the resources server's (``GET /tools``,
   asked once; a server without the route has none);
2. calls the model with the request (``model`` filled in when absent) under the rollout's
   prefix, ``url_path_for_run``, so each call is captured under the rollout;
3. runs each ``function_call`` of the answer against the resources server
   (``POST /tools/<name>``; the answer's body, or its error, is the call's output) and sends the
   conversation back, with the answer's items and one ``function_call_output`` per call;
4. stops when the model answers without a tool call or after ``max_steps`` model calls (the
   tool calls of the last one are then not run); then posts ``{**task, "response": response}``
   to ``/verify``, where ``response`` is the last answer whose ``output`` holds every turn's
   output items in order, and answers ``{"response", "reward", ...the other verify fields}``.

A streamed request (``stream: true``) is refused: the agent grades a whole answer.

When the run has a rollout id and a task (``_ng_task_index``, or a ``task_id``) and the model
server captured every call (its answers carry ``x-rollcap-model-call-id``), the answer carries
the agent's own evidence: ``ng_agent_observations`` (source ``simple_agent``: the invocation
and its tool calls' timings, for collection to join with the captured calls) and
``ng_trajectory`` (EVIDENCE.md sections 5.1 and 12): one ``root`` invocation
with the conversation the model saw and a reference to each call (its captured id, the model
server and the response id); one turn per model answer (``question`` the request's input,
``answer`` its non-reasoning output items, ``reasoning_content`` its reasoning items,
``step_count`` the tool calls before it); one tool call per tool run (timed by the agent,
``timing_source: executor``, ``status`` from the resources server's HTTP status, ``output``
what the model saw); and the gaps: ``resolution_unavailable`` when the verifier gave no bool
``resolved`` (else the last turn carries it), ``model_call_reference_unavailable`` (detail
``turn:<n>``) for an answer without an id. Collection merges the captured calls into it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from rollcap._json import json_type_name
from rollcap.evidence import (
    OBSERVATIONS_KEY,
    TRAJECTORY_KEY,
    AgentInvocation,
    AgentObservationBundle,
    ModelCallRef,
    ToolCallObservation,
    TrajectoryRecord,
    TrajectoryToolCall,
    TrajectoryTurn,
    trajectory_identity,
    turn_content,
)
from rollcap.gym._agents import RESPONSES_PATH, ResponsesAgent
from rollcap.gym._http import InvalidRequest
from rollcap.ids import rollout_id_from_run
from rollcap.records import MODEL_REF_TYPE, Gap
from rollcap.routing import url_path_for_run

__all__ = ["ROOT_INVOCATION", "SOURCE", "SimpleResponsesAgent"]

ROOT_INVOCATION = "root"
SOURCE = "simple_agent"  # the bundle's producer
GAP_RESOLUTION_UNAVAILABLE = "resolution_unavailable"
GAP_REFERENCE_UNAVAILABLE = "model_call_reference_unavailable"
GAP_TRANSCRIPT_UNAVAILABLE = "agent_transcript_unavailable"


@dataclass
class _Run:
    """What one run observed, for its trajectory."""

    started: float
    captured: bool = True
    refs: list[ModelCallRef] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)


def _as_items(value: Any) -> list[Any]:
    """A Responses ``input`` as a list of items: a string is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return list(value)
    raise InvalidRequest(
        f"responses_create_params.input must be a string or a list, got {json_type_name(value)}"
    )


class SimpleResponsesAgent(ResponsesAgent):
    """The agent behind ``simple_agent`` and ``mcqa_simple_agent`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tools: list[dict[str, Any]] | None = None

    async def resources_tools(self) -> list[dict[str, Any]]:
        """The resources server's tools, asked once per agent."""
        if self._tools is None:
            self._tools = await self.list_tools()
        return self._tools

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        params = body.get("responses_create_params")
        if not isinstance(params, dict):
            got = json_type_name(params) if "responses_create_params" in body else "none"
            raise InvalidRequest(f"responses_create_params must be a JSON object, got {got}")
        if params.get("stream"):
            raise InvalidRequest(
                f"{self.name} grades whole answers: responses_create_params.stream must be "
                "false or absent"
            )
        try:
            url_path = url_path_for_run(
                RESPONSES_PATH, body, training=self.settings.token_id_capture
            )
            rollout_id = rollout_id_from_run(body)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        request = self.with_model(params)
        if "tools" not in request:
            tools = await self.resources_tools()
            if tools:
                request = {**request, "tools": tools}
        run = _Run(started=time.time())
        conversation = _as_items(request.get("input", []))
        outputs: list[Any] = []
        response: dict[str, Any] = {}
        finished = False  # the model answered without a tool call
        for step in range(1, self.settings.max_steps + 1):
            called_at = time.time()
            response, call_id = await self.call_model_traced(url_path, request)
            items = [item for item in response.get("output") or () if isinstance(item, dict)]
            outputs += items
            conversation += items
            calls = [item for item in items if item.get("type") == "function_call"]
            self._note_turn(run, step, called_at, request, response, call_id)
            finished = not calls
            if finished or step == self.settings.max_steps:
                break
            for call in calls:
                conversation.append(await self._run_tool(run, call))
            request = {**request, "input": conversation}
        graded = {**response, "output": outputs}
        verified = await self.verify({**body, "response": graded})
        result: dict[str, Any] = {"response": graded, "reward": verified["reward"]}
        for key, value in verified.items():
            result.setdefault(key, value)
        if rollout_id is not None and run.captured:
            try:
                identity = trajectory_identity(body)
            except KeyError:  # neither a task id nor a task index: no trajectory to name
                return result
            resolved = verified.get("resolved")
            result[OBSERVATIONS_KEY], result[TRAJECTORY_KEY] = self._evidence(
                identity,
                run,
                conversation,
                resolved if isinstance(resolved, bool) else None,
                finished,
            )
        return result

    def _note_turn(
        self,
        run: _Run,
        step: int,
        called_at: float,
        request: dict[str, Any],
        response: dict[str, Any],
        model_call_id: str | None,
    ) -> None:
        if model_call_id is None:
            run.captured = False  # capture is off: nothing to join a trajectory with
        response_id = response.get("id") if isinstance(response.get("id"), str) else None
        server = self.settings.model_server_name
        ref: dict[str, Any] = {
            "model_call_id": model_call_id,
            "model_ref": None if server is None else {"type": MODEL_REF_TYPE, "name": server},
            "response_id": response_id,
        }
        refs: list[dict[str, Any]] = []
        if response_id is None:
            run.gaps.append(Gap(GAP_REFERENCE_UNAVAILABLE, f"turn:{step}", ROOT_INVOCATION))
        if model_call_id or (server is not None and response_id):
            run.refs.append(ModelCallRef.model_validate(ref))
            refs.append(ref)
        question, answer, reasoning, _ = turn_content(request, response)
        run.turns.append(
            {
                "invocation_id": ROOT_INVOCATION,
                "turn_no": step,
                "timestamp": called_at,
                "question": question,
                "answer": answer,
                "reasoning_content": reasoning,
                "step_count": len(run.tools),
                "model_calls": refs,
            }
        )

    async def _run_tool(self, run: _Run, call: dict[str, Any]) -> dict[str, Any]:
        """Run one function call; the ``function_call_output`` item the model sees next."""
        call_id = str(call.get("call_id") or call.get("id") or "")
        name = str(call.get("name") or "")
        started = time.time()
        try:
            arguments: Any = orjson.loads(call.get("arguments") or "{}")
        except orjson.JSONDecodeError as exc:
            arguments = exc
        if isinstance(arguments, dict):
            status, output = await self.call_tool(name, arguments)
        elif isinstance(arguments, Exception):
            status, output = 400, f"the arguments are not JSON: {arguments}"
        else:
            status = 400
            output = f"the arguments must be a JSON object, got {json_type_name(arguments)}"
        completed = time.time()
        ok = 200 <= status < 300
        run.tools.append(
            {
                "invocation_id": ROOT_INVOCATION,
                "tool_call_id": call_id,
                "tool_name": name,
                "started_at": started,
                "completed_at": completed,
                "duration_ms": (completed - started) * 1000,
                "timing_source": "executor",
                "status": "completed" if ok else "failed",
                "error_type": None if ok else f"http_{status}",
                "output": output,
            }
        )
        return {"type": "function_call_output", "call_id": call_id, "output": output}

    def _evidence(
        self,
        ids: tuple[str, str],
        run: _Run,
        conversation: list[Any],
        resolved: bool | None,
        finished: bool,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The run's ``ng_agent_observations`` and ``ng_trajectory``."""
        task_id, rollout_id = ids
        identity = {"task_id": task_id, "rollout_id": rollout_id}
        gaps = list(run.gaps)
        if resolved is None:
            gaps.append(Gap(GAP_RESOLUTION_UNAVAILABLE, None, ROOT_INVOCATION))
        elif run.turns:
            run.turns[-1]["resolved"] = resolved
        invocation: dict[str, Any] = {
            "invocation_id": ROOT_INVOCATION,
            "status": "completed" if finished else "incomplete",
            "duration_ms": max(0.0, (time.time() - run.started) * 1000),
            "model_calls": run.refs,
            "conversation": conversation,
        }
        try:
            invocations = [AgentInvocation.model_validate(invocation)]
        except ValueError as exc:  # an item the conversation shapes cannot hold
            invocations = [AgentInvocation.model_validate({**invocation, "conversation": []})]
            gaps.append(Gap(GAP_TRANSCRIPT_UNAVAILABLE, type(exc).__name__, ROOT_INVOCATION))
        record = TrajectoryRecord(
            task_id=task_id,
            rollout_id=rollout_id,
            invocations=invocations,
            turns=[TrajectoryTurn.model_validate({**turn, **identity}) for turn in run.turns],
            tool_calls=[TrajectoryToolCall.model_validate(tool) for tool in run.tools],
            gaps=gaps,
        )
        # The same invocation and tool timings, for collection to join with the captured calls;
        # a tool's output belongs to the conversation, not to its observation.
        bundle = AgentObservationBundle(
            source=SOURCE,
            records=[
                *invocations,
                *(
                    ToolCallObservation.model_validate(
                        {k: v for k, v in tool.items() if k != "output"}
                    )
                    for tool in run.tools
                ),
            ],
        )
        return bundle.model_dump(mode="json"), record.model_dump(mode="json")
