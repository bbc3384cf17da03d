"""An agent for the cluster tests, loaded by path (``entrypoint: .../agents.py:ManyCalls``).

It makes ``calls`` model calls per rollout (default 3), each asking ``"<rollout id> call <n>"``,
so a captured record names its rollout. With ``crash_marker`` set to a file, attempt 0 of the
rollout writes its rollout id there and ends its process at once: a rollout worker that dies.
With ``observe`` it answers ``ng_agent_observations`` too: one invocation that names its calls
by the ids the model server captured them under.
"""

from __future__ import annotations

import os
from typing import Any

from rollcap.gym import ResponsesAgent
from rollcap.ids import rollout_id_from_run
from rollcap.routing import url_path_for_run


class ManyCalls(ResponsesAgent):
    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        rollout_id = rollout_id_from_run(body)
        path = url_path_for_run("/v1/responses", body)
        marker = body.get("crash_marker")
        if marker and body.get("_ng_attempt_index") == 0:
            with open(marker, "a") as f:
                f.write(f"{rollout_id}\n")
            os._exit(1)
        response: dict[str, Any] = {}
        call_ids: list[str | None] = []
        for n in range(body.get("calls", 3)):
            response, call_id = await self.call_model_traced(
                path, {"model": "fake-model", "input": f"{rollout_id} call {n}"}
            )
            call_ids.append(call_id)
        answer: dict[str, Any] = {"response": response, "reward": 1.0}
        if body.get("observe"):
            invocation = {
                "kind": "agent_invocation",
                "invocation_id": rollout_id,
                "status": "completed",
                "model_calls": [{"model_call_id": call_id} for call_id in call_ids],
            }
            answer["ng_agent_observations"] = {"source": "many_calls", "records": [invocation]}
        return answer
