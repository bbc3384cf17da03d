"""An agent for the benchmarks, loaded by path (``entrypoint: bench/_agents.py:RepeatedCalls``)."""

from __future__ import annotations

from typing import Any

from rollcap.gym import SimpleResponsesAgent
from rollcap.routing import url_path_for_run


class RepeatedCalls(SimpleResponsesAgent):
    """The mcqa agent, making ``calls`` model calls per rollout (a task field, default 1): the
    same request ``calls - 1`` times, then the graded one."""

    async def run(self, body: dict[str, Any]) -> dict[str, Any]:
        params = self.with_model(body["responses_create_params"])
        path = url_path_for_run("/v1/responses", body)
        for _ in range(int(body.get("calls", 1)) - 1):
            await self.call_model(path, params)
        return await super().run(body)
