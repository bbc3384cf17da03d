"""Runtime helpers of the servers and the collector.

``batch``: one thread that does blocking work for an event loop, a batch at a time.
``serving``: ASGI apps under uvicorn on sockets bound up front.
``heap``: the garbage collector set for a process that serves calls.
"""
