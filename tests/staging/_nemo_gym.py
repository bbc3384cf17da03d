"""NeMo Gym 0.7.0's released staging code, run beside rollcap's (``test_nemo_gym_differential``).

``make nemo-gym`` downloads the pinned wheel from the package registry and unzips its
``nemo_gym/token_id_capture/`` into ``.nemo-gym/wheel/``. The wheel asks for Python >= 3.13.14,
so it is never installed; the modules compared here import only the standard library, pydantic
and orjson, and load on 3.11 as they are.

This file is two things:

- imported by the test: :class:`NemoGymProcess` starts this same file as a script in a process
  of its own, and the ``OPS`` below run one corpus through either side's API (``Api``): the
  test builds rollcap's ``Api`` in-process, the script builds NeMo Gym's, so both sides are
  driven by the same code and compared only through their JSON;
- run as a script (``python -I _nemo_gym.py WHEEL_DIR``): the NeMo Gym side. It puts stand-ins
  for the packages ``nemo_gym`` and ``nemo_gym.token_id_capture`` into ``sys.modules`` (their
  ``__init__.py``, which imports the rest of Gym, never runs), imports the staging modules
  from the wheel, then answers one JSON request per line on stdin. It imports nothing of
  rollcap (checked), and rollcap's process never holds a NeMo Gym module.

Nothing here is NeMo Gym's code: only the wheel, downloaded at setup, holds that.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import logging
import subprocess
import sys
import tempfile
import traceback
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

__all__ = [
    "ALLOWED_THIRD_PARTY",
    "LOADED_MODULES",
    "OPS",
    "SKIP_REASON",
    "VERSION",
    "WHEEL_DIR",
    "Api",
    "NemoGymProcess",
    "available",
    "module_imports",
]

VERSION = "0.7.0"
REPO = Path(__file__).resolve().parents[2]
NEMO_GYM_DIR = REPO / ".nemo-gym"
WHEEL_DIR = NEMO_GYM_DIR / "wheel"
STAMP = NEMO_GYM_DIR / f".installed-{VERSION}"
SKIP_REASON = f"NeMo Gym {VERSION}'s wheel is not in .nemo-gym/: run `make nemo-gym`"

PACKAGE = "nemo_gym.token_id_capture"
# The modules of the wheel that are loaded, and whose imports are checked. Loading the
# ``staging`` package runs its ``__init__.py``, which imports every staging module (and
# ``token_id_capture.terminal``); ``nemo_gym/__init__.py`` and
# ``token_id_capture/__init__.py`` are never run.
LOADED_MODULES = (
    f"{PACKAGE}.records",
    f"{PACKAGE}.fingerprint",
    f"{PACKAGE}.terminal",
    f"{PACKAGE}.staging",
    f"{PACKAGE}.staging.digest",
    f"{PACKAGE}.staging.records",
    f"{PACKAGE}.staging.protocols",
    f"{PACKAGE}.staging.capture",
    f"{PACKAGE}.staging.rebuild",
    f"{PACKAGE}.staging.routes",
    f"{PACKAGE}.staging.terminal",
    f"{PACKAGE}.staging.conformance",
    f"{PACKAGE}.adapters",
    f"{PACKAGE}.adapters.vllm",
    f"{PACKAGE}.adapters.megatron",
)
# What those modules may import besides the standard library and one another; pydantic brings
# its own few packages along.
ALLOWED_THIRD_PARTY = frozenset({"pydantic", "orjson"})
PYDANTIC_DEPENDENCIES = frozenset(
    {"pydantic_core", "typing_extensions", "annotated_types", "typing_inspection"}
)


def available() -> bool:
    """Whether ``make nemo-gym`` has put the wheel's staging code in place."""
    return STAMP.is_file() and (WHEEL_DIR / "nemo_gym" / "token_id_capture").is_dir()


def module_path(module: str) -> Path:
    """The file of one of ``LOADED_MODULES`` in the unzipped wheel."""
    path = WHEEL_DIR.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def module_imports(module: str) -> set[str]:
    """Every module one wheel module imports (read, not run); relative imports resolved."""
    tree = ast.parse(module_path(module).read_text(encoding="utf-8"))
    package = module if module_path(module).name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
    return found


# --- JSON ----------------------------------------------------------------------------------


def dump_model(model: Any) -> str:
    """A pydantic model's wire JSON: ``orjson.dumps(model_dump(mode="json"))``."""
    return orjson.dumps(model.model_dump(mode="json")).decode()


def _plain(value: Any) -> Any:
    # Tuples (extract_generation's pair) as lists, for the JSON transport.
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _refusal(exc: BaseException) -> dict[str, Any]:
    return {"refused": type(exc).__name__}


# --- one API, either side -------------------------------------------------------------------


@dataclass(frozen=True)
class Api:
    """One side's staging API, as the ``OPS`` use it. Every value is that side's own."""

    models: Mapping[str, Any]
    capture_cls: Any
    new_store: Callable[[], Any]
    store_attachments: Callable[[Any, str], dict[str, bytes]]
    adapters: Mapping[str, Callable[[], Any]]
    verify_and_linearize: Callable[..., Any]
    linearize: Callable[..., Any]
    verification_error: type[BaseException]
    row_json: Callable[[Any], str]
    assistant_fingerprint: Callable[[Any], str]
    conversation_digest: Callable[[Any], str]
    select_terminal_call: Callable[[Any], Any]
    resolve_terminal: Callable[..., Any]
    attribution: Callable[[Any], dict[str, Any]]
    digests: Mapping[str, Callable[..., Any]]
    extra: Mapping[str, Any] = field(default_factory=dict)


class _RecordingSink:
    """A sink in front of a store: records what it is handed, then behaves as told.

    ``ok`` (the store's answer), ``raise``, ``refuse`` (``ok: false``), ``not_a_result`` (a
    dict), ``none``.
    """

    def __init__(self, store: Any, behaviour: str, result_cls: Any) -> None:
        self._store = store
        self._behaviour = behaviour
        self._result_cls = result_cls
        self.seen: list[str] = []

    def stage(self, record: Any, *, attachments: Mapping[str, Any] | None = None) -> Any:
        self.seen.append(dump_model(record))
        if self._behaviour == "raise":
            raise RuntimeError("the sink is down")
        if self._behaviour == "refuse":
            return self._result_cls(ok=False, error="disk full")
        if self._behaviour == "not_a_result":
            return {"ok": True, "staging_key": "x/y"}
        if self._behaviour == "none":
            return None
        if attachments is None:
            return self._store.stage(record)
        return self._store.stage(record, attachments=attachments)


class _LegacySink:
    """A text-only sink: ``stage(record)``, no ``attachments`` keyword."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.seen: list[str] = []

    def stage(self, record: Any) -> Any:
        self.seen.append(dump_model(record))
        return self._store.stage(record)


def _payload(case: Mapping[str, Any]) -> Any:
    """An engine answer: the JSON as it is, or (``form: object``) a Megatron payload object."""
    payload = case.get("payload")
    if case.get("form") == "object" and isinstance(payload, dict):
        return types.SimpleNamespace(**payload)
    return payload


def _attachments(value: Any) -> dict[str, bytes] | None:
    if value is None:
        return None
    return {name: bytes.fromhex(data) for name, data in value.items()}


def _admission(
    store: Any, step: Mapping[str, Any], rollout_id: str, state: dict[str, Any]
) -> tuple[dict[str, Any], list[int] | None]:
    """A call's admission as the gate builds it from the parent's coords, and the prefix ids
    the worker hands ``begin_call`` (the chain's deltas fetched and concatenated)."""
    call = step["call"]
    parent = step.get("parent")
    if parent is None:
        admission: dict[str, Any] = {
            "rollout_id": rollout_id,
            "model_call_id": call,
            "mode": "text",
        }
        prefix: list[int] | None = None
    else:
        coords = state["coords"][parent]
        chain = state["chains"][parent]
        prev_len = step.get("prev_len", coords["cum_len"])
        full = [token for shot in store.fetch(chain) for token in shot.token_ids_delta]
        admission = {
            "rollout_id": rollout_id,
            "model_call_id": call,
            "parent_call_id": parent,
            "prev_len": prev_len,
            "mode": "token_in",
            "parent_chain_hash": coords["chain_hash"],
        }
        if step.get("inline"):
            admission["required_prefix_token_ids"] = full[:prev_len]
            prefix = None
        else:
            admission["staging_chain"] = chain
            prefix = full[:prev_len]
    admission.update(step.get("admission", {}))
    if "prefix" in step:
        prefix = step["prefix"]
    return admission, prefix


def run_rollouts(api: Api, rollouts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each rollout's calls through a fresh store and ``api``'s ``RolloutTokenCapture``.

    Per call: the admission's refusal, ``begin_call``'s exception, or the coords' JSON with the
    records the sink was handed and the class of the error a second completion raises. Per
    rollout: the base snapshots and attachments of every staged key, as the store returns them.
    """
    results: list[dict[str, Any]] = []
    for rollout in rollouts:
        rollout_id = rollout["rollout_id"]
        store = api.new_store()
        version = [rollout.get("version", 0)]
        state: dict[str, Any] = {"coords": {}, "chains": {}}
        keys: list[str] = []
        steps: list[dict[str, Any]] = []
        for step in rollout["calls"]:
            version[0] = step.get("version", version[0])
            out: dict[str, Any] = {"call": step["call"]}
            steps.append(out)
            behaviour = step.get("sink", "ok")
            sink: _RecordingSink | _LegacySink = (
                _LegacySink(store)
                if behaviour == "legacy"
                else _RecordingSink(store, behaviour, api.models["StageResult"])
            )
            adapter_name = step.get("adapter")
            capture = api.capture_cls(
                sink=sink,
                weight_version_fn=lambda version=version: version[0],
                adapter=api.adapters[adapter_name]() if adapter_name else None,
            )
            admission_json, prefix = _admission(store, step, rollout_id, state)
            try:
                admission = api.models["CaptureAdmission"].model_validate(admission_json)
            except Exception as exc:
                out["admission_refused"] = type(exc).__name__
                continue
            try:
                call = capture.begin_call(
                    admission,
                    prefix_token_ids=prefix,
                    stream=step.get("stream", False),
                    weight_version=step.get("weight_version"),
                )
            except Exception as exc:
                out["begin_refused"] = type(exc).__name__
                continue
            attachments = _attachments(step.get("attachments"))
            action = step.get("do", "complete")
            try:
                if action == "fail":
                    coords = capture.fail_call(call, reason="engine error")
                elif action == "response":
                    coords = capture.complete_call_from_response(
                        call, _payload(step), attachments=attachments
                    )
                else:
                    coords = capture.complete_call(
                        call,
                        prompt_token_ids=step["prompt"],
                        generated_token_ids=step["generated"],
                        generated_logprobs=step["logprobs"],
                        extras=step.get("extras"),
                        attachments=attachments,
                    )
            except Exception as exc:
                out["complete_raised"] = type(exc).__name__
                continue
            try:
                out["coords"] = dump_model(coords)
            except Exception as exc:  # e.g. a weight version beyond what orjson writes
                out["coords"] = None
                out["coords_unwritable"] = type(exc).__name__
            out["records"] = sink.seen
            try:
                capture.fail_call(call, reason="again")
                out["again"] = None
            except Exception as exc:
                out["again"] = type(exc).__name__
            if coords.disposition == "staged":
                state["coords"][step["call"]] = coords.model_dump(mode="json")
                parent = step.get("parent")
                state["chains"][step["call"]] = [
                    *(state["chains"][parent] if parent is not None else []),
                    coords.staging_key,
                ]
                keys.append(coords.staging_key)
        results.append(
            {
                "rollout_id": rollout_id,
                "steps": steps,
                "snapshots": [dump_model(shot) for shot in store.fetch(keys)],
                "attachments": {
                    key: {n: v.hex() for n, v in api.store_attachments(store, key).items()}
                    for key in keys
                },
            }
        )
    return results


def _materialize(api: Api, case: Mapping[str, Any]) -> tuple[Any, list[Any]]:
    """The receipt (or the manifest rows, for ``linearize``) and snapshots of a rebuild case:
    validated from their JSON, or (``construct``) built as given with ``model_construct``."""
    receipt_cls = api.models["RolloutReceipt"]
    row_cls = api.models["CallRecord"]
    shot_cls = api.models["StagedCallBaseSnapshot"]
    if case.get("construct"):
        data = json.loads(case["receipt"])
        rows = [row_cls.model_construct(**row) for row in data.pop("manifest", [])]
        receipt = receipt_cls.model_construct(manifest=rows, **data)
        shots = [shot_cls.model_construct(**json.loads(shot)) for shot in case["snapshots"]]
    else:
        receipt = receipt_cls.model_validate_json(case["receipt"])
        shots = [shot_cls.model_validate_json(shot) for shot in case["snapshots"]]
    return receipt, shots


def rebuild(api: Api, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``verify_and_linearize`` (or, with ``hint`` in the case, ``linearize``) per case: the
    row's JSON, the refusal's code and class, or the exception's class."""
    out: list[dict[str, Any]] = []
    for case in cases:
        try:
            receipt, shots = _materialize(api, case)
        except Exception as exc:
            out.append({"parse_refused": type(exc).__name__})
            continue
        try:
            if "hint" in case:
                row = api.linearize(
                    receipt.rollout_id, shots, list(receipt.manifest), terminal_hint=case["hint"]
                )
            else:
                row = api.verify_and_linearize(receipt, shots)
        except api.verification_error as exc:
            out.append({"code": getattr(exc, "code", None), "cls": type(exc).__name__})
            continue
        except Exception as exc:
            out.append({"raised": type(exc).__name__})
            continue
        out.append({"row": api.row_json(row)})
    return out


def parse(api: Api, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``<model>.model_validate_json`` per case: the model's JSON again, or the error class."""
    out: list[dict[str, Any]] = []
    for case in cases:
        try:
            model = api.models[case["model"]].model_validate_json(case["json"])
        except Exception as exc:
            out.append(_refusal(exc))
            continue
        out.append({"json": dump_model(model)})
    return out


def _call(function: Callable[..., Any], *args: Any) -> dict[str, Any]:
    try:
        return {"value": _plain(function(*args))}
    except Exception as exc:
        return _refusal(exc)


def adapt(api: Api, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each ``extract_*`` of the named adapter on one engine answer, and ``enter_prefix``."""
    out: list[dict[str, Any]] = []
    for case in cases:
        adapter = api.adapters[case["adapter"]]()
        payload = _payload(case)
        result = {
            name: _call(getattr(adapter, name), payload)
            for name in ("extract_prompt_ids", "extract_generation", "extract_extras")
        }
        result["enter_prefix"] = _call(adapter.enter_prefix, {"model": "m"}, [1, 2, 3])
        out.append(result)
    return out


def fingerprint(api: Api, cases: Sequence[Any]) -> list[dict[str, Any]]:
    """``assistant_fingerprint`` and ``conversation_digest`` of each item list."""
    return [
        {
            "assistant_fingerprint": _call(api.assistant_fingerprint, items),
            "conversation_digest": _call(api.conversation_digest, items),
        }
        for items in cases
    ]


def _rows(api: Api, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
    return [api.models["CallRecord"].model_validate(row) for row in rows]


def select(api: Api, cases: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """``select_terminal_call`` over each list of manifest rows."""
    out: list[dict[str, Any]] = []
    for rows in cases:
        chosen = api.select_terminal_call(_rows(api, rows))
        out.append({"terminal": chosen.terminal_model_call_id, "reason": chosen.reason})
    return out


def resolve(api: Api, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``resolve_terminal(rows, response, explicit, declared_response_id=...)`` per case."""
    out: list[dict[str, Any]] = []
    for case in cases:
        try:
            found = api.resolve_terminal(
                _rows(api, case["rows"]),
                case.get("response"),
                case.get("explicit"),
                declared_response_id=case.get("declared"),
            )
        except Exception as exc:
            out.append(_refusal(exc))
            continue
        out.append(api.attribution(found))
    return out


def digest(api: Api, cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One digest function (``fn``) per case, on ``args`` (positional) or ``kwargs``."""
    out: list[dict[str, Any]] = []
    for case in cases:
        function = api.digests[case["fn"]]
        try:
            value = function(*case.get("args", []), **case.get("kwargs", {}))
        except Exception as exc:
            out.append(_refusal(exc))
            continue
        out.append({"value": value.hex() if isinstance(value, bytes) else value})
    return out


OPS: dict[str, Callable[[Api, Any], Any]] = {
    "capture": run_rollouts,
    "rebuild": rebuild,
    "parse": parse,
    "adapt": adapt,
    "fingerprint": fingerprint,
    "select": select,
    "resolve": resolve,
    "digest": digest,
}


# --- the test's end: the process ------------------------------------------------------------


class NemoGymProcess:
    """This file run as NeMo Gym's side, in a process of its own; ``call`` sends one request.

    The transport is the standard library's JSON (it carries NaN, infinities and integers of
    any size, which some of the corpus needs). Their exceptions come back as class names; a
    crash of the driver itself raises ``RuntimeError`` with its traceback.
    """

    def __init__(self) -> None:
        # Closed by close(), with the process: it outlives this method.
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._process = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).resolve()), str(WHEEL_DIR)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=str(NEMO_GYM_DIR),
        )
        try:
            self.info: dict[str, Any] = self.call("info", None)
        except BaseException:
            self.close()
            raise

    def _pipes(self) -> tuple[IO[bytes], IO[bytes]]:
        stdin, stdout = self._process.stdin, self._process.stdout
        assert stdin is not None
        assert stdout is not None
        return stdin, stdout

    def call(self, op: str, args: Any) -> Any:
        stdin, stdout = self._pipes()
        stdin.write(json.dumps({"op": op, "args": args}).encode() + b"\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the NeMo Gym driver exited: {self._errors()}")
        answer = json.loads(line)
        if "crash" in answer:
            raise RuntimeError(f"the NeMo Gym driver failed on {op}: {answer['crash']}")
        return answer["result"]

    def _errors(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        stdin, stdout = self._pipes()
        stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        stdout.close()
        self._stderr.close()


# --- the script's end: NeMo Gym's side ------------------------------------------------------


def _load(wheel: Path) -> dict[str, Any]:
    """The wheel's staging modules, without running ``nemo_gym``'s or ``token_id_capture``'s
    ``__init__.py``: their packages are empty stand-ins pointing at the wheel's folders."""
    for name in ("nemo_gym", PACKAGE):
        stand_in = types.ModuleType(name)
        stand_in.__path__ = [str(wheel.joinpath(*name.split(".")))]
        sys.modules[name] = stand_in
    return {name: importlib.import_module(name) for name in LOADED_MODULES}


class _TheirStore:
    """An in-memory store for their capture: ``StageResult`` with the default key; ``fetch``
    gives their base snapshots (the record without its extras)."""

    def __init__(self, records: Any) -> None:
        self._records_module = records
        self._records: dict[str, tuple[Any, Mapping[str, Any] | None]] = {}

    def stage(self, record: Any, *, attachments: Mapping[str, Any] | None = None) -> Any:
        key = self._records_module.staging_key(record.rollout_id, record.model_call_id)
        self._records[key] = (record, attachments)
        return self._records_module.StageResult(ok=True, staging_key=key)

    def fetch(self, keys: Sequence[str]) -> list[Any]:
        base = self._records_module.StagedCallBaseSnapshot
        return [
            base.model_validate(self._records[key][0].model_dump(exclude={"extras"}))
            for key in keys
        ]

    def attachments(self, key: str) -> dict[str, bytes]:
        return dict(self._records[key][1] or {})


def _their_api(modules: Mapping[str, Any]) -> Api:
    staging = modules[f"{PACKAGE}.staging"]
    records = modules[f"{PACKAGE}.staging.records"]
    digest_module = modules[f"{PACKAGE}.staging.digest"]
    fingerprint_module = modules[f"{PACKAGE}.fingerprint"]

    def attribution(found: Any) -> dict[str, Any]:
        return {"terminal": found.model_call_id, "method": found.method, "reason": found.reason}

    return Api(
        models={
            name: getattr(records, name)
            for name in (
                "CaptureAdmission",
                "StagedCallBaseSnapshot",
                "StagedCallRecord",
                "StagedCallSnapshot",
                "StageResult",
                "CommitCoords",
                "CallRecord",
                "ManifestFailure",
                "RolloutManifest",
                "RolloutReceipt",
            )
        },
        capture_cls=staging.RolloutTokenCapture,
        new_store=lambda: _TheirStore(records),
        store_attachments=lambda store, key: store.attachments(key),
        adapters={
            "vllm": modules[f"{PACKAGE}.adapters.vllm"].VLLMCaptureAdapter,
            "megatron": modules[f"{PACKAGE}.adapters.megatron"].MegatronCaptureAdapter,
        },
        verify_and_linearize=staging.verify_and_linearize,
        linearize=staging.linearize,
        verification_error=staging.ReceiptVerificationError,
        row_json=lambda row: orjson.dumps(dataclasses.asdict(row)).decode(),
        assistant_fingerprint=fingerprint_module.assistant_fingerprint,
        conversation_digest=fingerprint_module.conversation_digest,
        select_terminal_call=staging.select_terminal_call,
        resolve_terminal=staging.resolve_terminal,
        attribution=attribution,
        digests={
            "extras": digest_module.compute_extras_digest,
            "staging": digest_module.compute_staging_digest,
            "chain": digest_module.compute_chain_hash,
            "hash_ids": digest_module.hash_token_ids,
            "encode_ids": digest_module.encode_token_ids,
        },
        extra={"conformance": modules[f"{PACKAGE}.staging.conformance"]},
    )


def _info(api: Api, baseline: set[str]) -> dict[str, Any]:
    loaded = sorted(name for name in sys.modules if name.split(".")[0] == "nemo_gym")
    stand_ins = {
        name: getattr(sys.modules[name], "__file__", None) for name in ("nemo_gym", PACKAGE)
    }
    top = {name.split(".")[0] for name in sys.modules} - baseline
    conformance = api.extra["conformance"]
    try:
        conformance.assert_golden_vectors()
        asserted: str | None = None
    except Exception as exc:
        asserted = f"{type(exc).__name__}: {exc}"
    return {
        "python": sys.version.split()[0],
        "loaded": loaded,
        "stand_in_files": stand_ins,
        "new_top_level": sorted(top - set(sys.stdlib_module_names)),
        "rollcap_loaded": any(name.split(".")[0] == "rollcap" for name in sys.modules),
        "assert_golden_vectors": asserted,
        "golden_vectors": conformance.load_golden_vectors(),
    }


def _serve(lines: Iterator[bytes], write: Callable[[bytes], Any], info: Callable[[], Any]) -> None:
    api_ops: dict[str, Callable[[Any], Any]] = {"info": lambda _args: info()}
    for line in lines:
        request = json.loads(line)
        try:
            handler = api_ops.get(request["op"])
            result = (
                handler(request["args"]) if handler else OPS[request["op"]](_API, request["args"])
            )
            answer = json.dumps({"result": result})
        except Exception:
            answer = json.dumps({"crash": traceback.format_exc()})
        write(answer.encode() + b"\n")


_API: Api


def _main(argv: Sequence[str]) -> None:
    global _API
    # Their capture logs every capture_failed with its traceback; the test compares outcomes.
    logging.disable(logging.CRITICAL)
    baseline = {name.split(".")[0] for name in sys.modules}
    _API = _their_api(_load(Path(argv[1])))
    out = sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    _serve(iter(sys.stdin.buffer.readline, b""), write, lambda: _info(_API, baseline))


if __name__ == "__main__":
    _main(sys.argv)
