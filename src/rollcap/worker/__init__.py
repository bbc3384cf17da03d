"""The token-capture worker: RL staging in front of a vLLM-compatible chat endpoint.

A thin server between the model server and an inference engine. A chat request that carries an
admission (``ng_capture``) is sent upstream asking for exact token ids and logprobs, staged
through ``rollcap.staging`` into a directory before the answer goes out, and answered with the
upstream's JSON plus ``ng_commit_coords``; so the whole RL path runs without an RL framework.
Run it with ``rollcap serve worker``.
"""

from rollcap.worker._app import create_worker_app
from rollcap.worker._settings import WorkerSettings

__all__ = ["WorkerSettings", "create_worker_app"]
