"""The durable sketch: the least a durable capture proxy in Python does, for bench/proxy.py.

    python bench/_sketch.py UPSTREAM_URL CAPTURE_DIR

Forwards ``POST [/ng-rollout/<id>]/v1/chat/completions`` and ``/v1/responses`` to the upstream
with aiohttp and passes the answer on unchanged; appends one orjson line per call (request,
response body or raw SSE text, status, timings) to ``<id>.jsonl`` and fsyncs it in a thread
before the answer (a stream: its terminal event) leaves. Prints ``sketch on <url>`` when ready.
"""

import asyncio
import os
import sys
import time

import aiohttp
import orjson
from aiohttp import web

HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}
PASSED = {"content-type", "content-encoding"}
TERMINAL = (b"data: [DONE]", b"event: response.completed", b"event: response.incomplete",
            b"event: response.failed")  # fmt: skip
fds: dict[str, int] = {}


def _durable(rollout: str, line: bytes) -> None:  # in a thread: one append, one fsync
    if (fd := fds.get(rollout)) is None:  # a new file: its directory entry made durable too
        path = os.path.join(sys.argv[2], f"{rollout}.jsonl")
        fd = fds.setdefault(rollout, os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        directory = os.open(sys.argv[2], os.O_RDONLY)
        os.fsync(directory)
        os.close(directory)
    os.write(fd, line)
    os.fsync(fd)


async def handle(request: web.Request) -> web.StreamResponse:
    start, body = time.time(), await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    url = sys.argv[1] + "/v1/" + request.match_info["dialect"]
    async with request.app["session"].post(url, data=body, headers=headers) as up:
        rollout = request.match_info.get("rollout", "default")
        record = {"rollout": rollout, "path": request.path, "request": orjson.loads(body),
                  "status": up.status, "started_at": start}  # fmt: skip
        out = {k: v for k, v in up.headers.items() if k.lower() in PASSED}
        if not up.headers.get("content-type", "").startswith("text/event-stream"):
            data = await up.read()
            record |= {"response": orjson.loads(data) if up.status == 200 else data.decode(),
                       "total_s": time.time() - start}  # fmt: skip
            await _sync(record)
            return web.Response(body=data, status=up.status, headers=out)
        response, raw, held, first = web.StreamResponse(status=up.status, headers=out), [], b"", 0.0
        await response.prepare(request)
        async for chunk in up.content.iter_any():
            first, held = first or time.time(), held + chunk
            raw.append(chunk)
            if not any(marker in held for marker in TERMINAL):  # hold the terminal event
                await response.write(held)
                held = b""
        record |= {"sse": b"".join(raw).decode(), "first_chunk_s": (first or start) - start,
                   "total_s": time.time() - start}  # fmt: skip
        await _sync(record)
        await response.write(held)
        await response.write_eof()
        return response


async def _sync(record: dict[str, object]) -> None:
    line = orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)
    await asyncio.get_running_loop().run_in_executor(None, _durable, record["rollout"], line)


async def main() -> None:
    app = web.Application(client_max_size=64 * 2**20)
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                           auto_decompress=False)  # fmt: skip
    for prefix in ("", "/ng-rollout/{rollout}"):
        app.router.add_post(prefix + "/v1/{dialect:chat/completions|responses}", handle)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=65)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"sketch on http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", flush=True)  # type: ignore[union-attr]
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
