"""Conversation items: a Responses input item, validated and re-serialized (pure).

An invocation's ``conversation`` holds the model-visible history as Responses API input items.
Each item is validated against the item shapes below and written back as the shape that fits
it best, with its declared optional fields filled in as nulls, in declaration order (the table
of EVIDENCE.md section 2.5). Where several shapes fit, the one that uses the most of the item's
keys wins, and the earlier one on a tie: pydantic's "smart" union. Keys no shape declares are
dropped. An item that fits no shape is invalid, and with it the bundle that carries it.

Item types outside the common ones (hosted tools, MCP, computer use, shell, patches,
compaction, ...) are kept as sent, keyed by their ``type``: their shapes change with the
Responses API and are not re-serialized here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired, Required, TypeAlias

from pydantic import BaseModel, ConfigDict, PlainValidator, TypeAdapter, ValidationError
from typing_extensions import TypedDict

__all__ = ["OTHER_ITEM_TYPES", "ConversationItem", "normalize_item"]

# Responses input item types carried through unchanged.
OTHER_ITEM_TYPES = frozenset(
    (
        "apply_patch_call",
        "apply_patch_call_output",
        "code_interpreter_call",
        "compaction",
        "computer_call",
        "computer_call_output",
        "custom_tool_call",
        "custom_tool_call_output",
        "file_search_call",
        "image_generation_call",
        "item_reference",
        "local_shell_call",
        "local_shell_call_output",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "mcp_list_tools",
        "shell_call",
        "shell_call_output",
        "tool_search_call",
        "tool_search_output",
        "web_search_call",
    )
)

_Status = Literal["in_progress", "completed", "incomplete"]
_Phase = Literal["commentary", "final_answer"]


class _Item(BaseModel):
    # Unknown keys are dropped, not refused: an item is re-serialized, never rejected for them.
    model_config = ConfigDict(extra="ignore")


class _InputText(TypedDict):
    type: Literal["input_text"]
    text: str


class _InputImage(TypedDict, total=False):
    type: Required[Literal["input_image"]]
    detail: str
    image_url: str | None
    file_id: str | None


class _InputFile(TypedDict, total=False):
    type: Required[Literal["input_file"]]
    file_data: str | None
    file_id: str | None
    file_url: str | None
    filename: str | None


class _InputAudio(TypedDict):
    type: Literal["input_audio"]
    input_audio: dict[str, Any]


class _InputVideo(TypedDict, total=False):
    type: Required[Literal["input_video"]]
    video_url: NotRequired[str | dict[str, Any]]
    video: NotRequired[str | dict[str, Any]]


_InputPart: TypeAlias = _InputText | _InputImage | _InputFile | _InputAudio | _InputVideo


class _EasyInputMessage(_Item):
    content: str | list[_InputPart]
    role: Literal["user", "assistant", "system", "developer"]
    type: Literal["message"] = "message"
    phase: _Phase | None = None


class _InputMessage(_Item):
    content: list[_InputPart]
    role: Literal["user", "system", "developer"]
    status: _Status = "completed"
    type: Literal["message"] = "message"


class _OutputText(_Item):
    annotations: list[dict[str, Any]]
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: list[dict[str, Any]] | None = None


class _OutputRefusal(_Item):
    refusal: str
    type: Literal["refusal"] = "refusal"


class _OutputMessage(_Item):
    id: str
    content: list[_OutputText | _OutputRefusal]
    role: Literal["assistant"] = "assistant"
    status: _Status = "completed"
    type: Literal["message"] = "message"
    phase: _Phase | None = None


class _FunctionCall(_Item):
    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"] = "function_call"
    id: str | None = None
    status: _Status | None = None
    namespace: str | None = None


class _FunctionCallOutput(_Item):
    call_id: str
    output: str | list[dict[str, Any]]
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    status: _Status | None = None


class _SummaryText(_Item):
    text: str
    type: Literal["summary_text"]


class _ReasoningText(_Item):
    text: str
    type: Literal["reasoning_text"]


class _Reasoning(_Item):
    id: str
    summary: list[_SummaryText]
    type: Literal["reasoning"] = "reasoning"
    encrypted_content: str | None = None
    content: list[_ReasoningText] | None = None


class _TokenIds(BaseModel):
    """What a policy's own sampled item carries for training, all or nothing."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: str | list[list[list[int]]] | None = None


class _EasyInputMessageTokens(_EasyInputMessage, _TokenIds):
    pass


class _InputMessageTokens(_InputMessage, _TokenIds):
    pass


class _OutputMessageTokens(_OutputMessage, _TokenIds):
    pass


class _FunctionCallTokens(_FunctionCall, _TokenIds):
    pass


class _ReasoningTokens(_Reasoning, _TokenIds):
    pass


_ITEMS: TypeAdapter[Any] = TypeAdapter(
    _EasyInputMessage
    | _InputMessage
    | _OutputMessage
    | _FunctionCall
    | _FunctionCallOutput
    | _Reasoning
    | _EasyInputMessageTokens
    | _InputMessageTokens
    | _OutputMessageTokens
    | _FunctionCallTokens
    | _ReasoningTokens
)


def normalize_item(item: object) -> dict[str, Any]:
    """``item`` as the item shape that fits it writes it; ``ValueError`` when none fits."""
    if not isinstance(item, dict):
        raise ValueError(f"a conversation item is a JSON object, not {type(item).__name__}")
    if item.get("type") in OTHER_ITEM_TYPES:
        return dict(item)
    try:
        model = _ITEMS.validate_python(item)
    except ValidationError as exc:
        raise ValueError(f"not a Responses input item ({exc.error_count()} errors)") from None
    dumped: dict[str, Any] = model.model_dump(mode="json")
    return dumped


ConversationItem: TypeAlias = Annotated[dict[str, Any], PlainValidator(normalize_item)]
