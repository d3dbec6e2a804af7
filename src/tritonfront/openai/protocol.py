"""The OpenAI API's wire schemas: request bodies, parsed and checked before anything reaches Triton.

Types are strict (a number sent as a string is an error, as OpenAI answers it) and an unknown
field is refused, as OpenAI refuses it ("Unrecognized request argument supplied"), so a misspelled
parameter never goes silently unused. Fields OpenAI defines that mean nothing here (`user`,
`metadata`, `store`, `service_tier`) are accepted and ignored; `tools`, `tool_choice` and
`parallel_tool_calls` are checked by tools.parse_request; fields that ask
for something this server cannot do (`functions`, `logit_bias`, audio ...) are accepted only with a
value that asks for nothing. Besides OpenAI's fields, vLLM's sampling extensions that the
generation contract has (`top_k`, `min_tokens`, `repetition_penalty`) are accepted.

Fields that accept several shapes (`stop`: a string or a list) are normalized by a validator of
their own, so an error names the field alone, never one of pydantic's union branches.
`parse(model_class, body)` returns the model or raises OpenAIError naming the field.
"""
import json
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from .api_errors import invalid, unsupported

INT32_MAX = 2**31 - 1
INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1
MAX_EMBEDDING_INPUTS = 2048  # as OpenAI's limit per request


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, protected_namespaces=(),
                              populate_by_name=True)


def _string_list(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise ValueError(f"must be a string or a list of strings, got {_kind(value)}")


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list of " + ", ".join(sorted({_kind(v) for v in value})) if value else "an empty list"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object",
            type(None): "null"}.get(type(value), type(value).__name__)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT32_MAX


def _texts_or_token_ids(value: Any) -> Any:
    """A string, a list of strings, a list of token ids or a list of lists of token ids; returned
    as a list of strings or a list of lists of ids."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and not value:
        raise ValueError("must not be empty")
    if isinstance(value, list):
        if all(isinstance(item, str) for item in value):
            return value
        if all(_is_id(item) for item in value):
            return [value]
        if all(isinstance(item, list) and item and all(_is_id(i) for i in item) for item in value):
            return value
    raise ValueError("must be a string, a list of strings, a list of token ids or a list of non-empty lists of "
                     f"token ids (integers in 0..{INT32_MAX}), got {_kind(value)}")


def _content_text(value: Any) -> Any:
    """A message's content as one string: a string, or the text of a list of text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                    and set(part) == {"type", "text"}):
                kind = part.get("type") if isinstance(part, dict) else None
                unsupported_kind = f"; parts of type {kind!r} are not supported" if kind not in (None, "text") else ""
                raise ValueError(f"part {i} must be {{\"type\": \"text\", \"text\": <string>}}{unsupported_kind}")
            texts.append(part["text"])
        return "".join(texts)
    raise ValueError(f"must be a string or a list of text parts, got {_kind(value)}")


StringList = Annotated[Optional[list[str]], BeforeValidator(_string_list)]
TextsOrTokenIds = Annotated[list, BeforeValidator(_texts_or_token_ids)]


class FunctionCall(Body):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(Body):
    """A turn of the history: an assistant's may carry the tool calls it made (its content then
    may be null), a tool's carries a call's result and the id of the call."""
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Annotated[str, BeforeValidator(_content_text)]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None

    @model_validator(mode="after")
    def _fields_of_its_role(self) -> "Message":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (an assistant's may be null only with tool_calls)")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message has tool_calls")
        if (self.tool_call_id is not None) != (self.role == "tool"):
            raise ValueError("a tool message needs tool_call_id, and only it has one")
        return self


class StreamOptions(Body):
    include_usage: bool = False


class JsonSchema(Body):
    name: str
    description: Optional[str] = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: Optional[bool] = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchema] = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is required with type json_schema, and only with it")
        return self


# OpenAI features this server does not have; a value that asks for nothing is accepted.
UNSUPPORTED = {
    "functions": "function calling is not supported",
    "function_call": "function calling is not supported",
    "logit_bias": "logit bias is not supported",
    "modalities": "only text output is supported",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "reasoning_effort": "the served model does not reason",
    "web_search_options": "web search is not supported",
    "suffix": "suffixes (insertion) are not supported",
}
_ASKS_NOTHING = (None, [], {}, "none", "auto", ["text"])


class Sampling(Body):
    """What completions and chat completions share."""
    model: str
    n: int = Field(1, ge=1, le=128)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    stop: StringList = None
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    seed: Optional[int] = Field(None, ge=INT64_MIN, le=UINT64_MAX)
    presence_penalty: Optional[float] = Field(None, ge=-2, le=2)
    frequency_penalty: Optional[float] = Field(None, ge=-2, le=2)
    max_tokens: Optional[int] = Field(None, ge=1, le=INT32_MAX)
    # vLLM's sampling extensions
    top_k: Optional[int] = Field(None, ge=0, le=INT32_MAX)
    min_tokens: Optional[int] = Field(None, ge=0, le=INT32_MAX)
    repetition_penalty: Optional[float] = Field(None, gt=0, le=100)
    # accepted, ignored
    user: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    store: Optional[bool] = None
    service_tier: Optional[str] = None
    # refused unless they ask for nothing
    logit_bias: Optional[dict[str, Any]] = None

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, why in UNSUPPORTED.items():
                if name in data and data[name] not in _ASKS_NOTHING:
                    raise _Refused(name, why)
        return data

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> "Sampling":
        if self.stream_options is not None and not self.stream:
            raise _Refused("stream_options", "is only allowed when stream is true")
        return self


class _Refused(ValueError):
    """Raised inside validation for a field that is refused as a whole (pydantic reports it at the
    model's level; parse() puts the field's name back)."""

    def __init__(self, param: str, why: str):
        super().__init__(why)
        self.param, self.why = param, why


class ChatCompletionRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1, le=INT32_MAX)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    response_format: Optional[ResponseFormat] = None
    parallel_tool_calls: Optional[bool] = None
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    functions: Optional[list[Any]] = None
    function_call: Optional[Union[str, dict[str, Any]]] = None
    modalities: Optional[list[str]] = None
    audio: Optional[dict[str, Any]] = None
    prediction: Optional[dict[str, Any]] = None
    reasoning_effort: Optional[str] = None
    web_search_options: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise _Refused("top_logprobs", "is only allowed when logprobs is true")
        return self

    @property
    def completion_limit(self) -> tuple[Optional[int], str]:
        """(the client's limit on generated tokens, the parameter it came in)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class CompletionRequest(Sampling):
    prompt: TextsOrTokenIds
    echo: bool = False
    logprobs: Optional[int] = Field(None, ge=0, le=5)
    best_of: Optional[int] = Field(None, ge=1, le=128)
    suffix: Optional[str] = None

    @model_validator(mode="after")
    def _best_of_is_n(self) -> "CompletionRequest":
        if self.best_of is not None and self.best_of != self.n:
            raise _Refused("best_of", f"{self.best_of} asks to rank more sequences than n ({self.n}); "
                                      "ranking is not supported: leave it out or equal to n")
        return self


class EmbeddingRequest(Body):
    model: str
    input: TextsOrTokenIds
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1, le=INT32_MAX)
    user: Optional[str] = None

    @model_validator(mode="after")
    def _not_too_many(self) -> "EmbeddingRequest":
        if len(self.input) > MAX_EMBEDDING_INPUTS:
            raise _Refused("input", f"{len(self.input)} inputs is over the limit of {MAX_EMBEDDING_INPUTS} per request")
        empty = next((i for i, text in enumerate(self.input) if text == ""), None)
        if empty is not None:  # as OpenAI answers it: an empty text has nothing to embed
            raise _Refused("input", "must not be an empty string" if len(self.input) == 1 else
                           f"input[{empty}] must not be an empty string")
        return self


# vLLM's utility routes (vllm/entrypoints/serve/tokenize, pooling/scoring): `model` may be left out
# (the first served model of the kind the route serves), as vLLM allows.

class TokenizeCompletionRequest(Body):
    """/tokenize of a raw prompt: its ids as the model's tokenizer gives them."""
    model: Optional[str] = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: Optional[bool] = False


class TokenizeChatRequest(Body):
    """/tokenize of a conversation: its ids through the model's chat template, as the generation
    ensemble is fed them for /v1/chat/completions."""
    model: Optional[str] = None
    messages: list[Message] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: Optional[bool] = False
    tools: Optional[list[Any]] = None
    # vLLM's; refused unless they ask for nothing
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    mm_processor_kwargs: Optional[dict[str, Any]] = None

    @model_validator(mode="after")
    def _one_way_to_end(self) -> "TokenizeChatRequest":
        if self.continue_final_message and self.add_generation_prompt:
            raise _Refused("continue_final_message", "cannot be true with add_generation_prompt true")
        return self


class DetokenizeTokensRequest(Body):
    model: Optional[str] = None
    tokens: list[Annotated[int, Field(ge=0, le=INT32_MAX)]]


def _texts(value: Any) -> Any:
    """A string or a list of strings (a score's or a rerank's inputs), as a list."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise ValueError(f"must be a string or a list of strings, got {_kind(value)}")


Texts = Annotated[Optional[list[str]], BeforeValidator(_texts)]
# vLLM's names for a score's two sides, each pair one way of writing it.
SCORE_PAIRS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))
SCORE_SIDES = tuple(dict.fromkeys(name for pair in SCORE_PAIRS for name in pair))


class ScoreRequest(Body):
    """/v1/score: the similarity of text_1 to each of text_2 (1:1, 1:N or N:N pairs)."""
    model: Optional[str] = None
    text_1: Texts = None
    text_2: Texts = None
    queries: Texts = None
    documents: Texts = None
    items: Texts = None
    data_1: Texts = None
    data_2: Texts = None
    user: Optional[str] = None

    @model_validator(mode="after")
    def _one_pair(self) -> "ScoreRequest":
        present = [name for name in SCORE_SIDES if getattr(self, name) is not None]
        given = [pair for pair in SCORE_PAIRS if set(pair) <= set(present)]
        if len(present) == 1:
            name = present[0]
            partner = next(second if first == name else first for first, second in SCORE_PAIRS if name in (first, second))
            raise _Refused(partner, f"is required with {name}")
        if len(given) != 1 or len(present) != 2:
            raise _Refused("text_1", "give the two sides as one of: "
                           + ", ".join(f"{first} and {second}" for first, second in SCORE_PAIRS))
        (first, second), = given
        left, right = getattr(self, first), getattr(self, second)
        if not left:
            raise _Refused(first, "must not be empty")
        if not right:
            raise _Refused(second, "must not be empty")
        if len(left) > 1 and len(left) != len(right):
            raise _Refused(second, f"has {len(right)} texts for {len(left)} in {first}: the pairs must be 1:1, "
                                   "1:N or N:N")
        if len(left) + len(right) > MAX_EMBEDDING_INPUTS:
            raise _Refused(second, f"{len(left) + len(right)} texts is over the limit of {MAX_EMBEDDING_INPUTS} "
                                   "per request")
        return self

    @property
    def sides(self) -> tuple[str, list[str], str, list[str]]:
        """(first side's name, its texts, second side's name, its texts)."""
        first, second = next(pair for pair in SCORE_PAIRS if getattr(self, pair[0]) is not None
                             and getattr(self, pair[1]) is not None)
        return first, getattr(self, first), second, getattr(self, second)


class RerankRequest(Body):
    """/v1/rerank: documents ordered by their similarity to the query."""
    model: Optional[str] = None
    query: str
    documents: Annotated[list[str], BeforeValidator(_texts)] = Field(min_length=1)
    top_n: int = Field(0, ge=0, le=INT32_MAX)
    user: Optional[str] = None

    @model_validator(mode="after")
    def _not_too_many(self) -> "RerankRequest":
        if len(self.documents) + 1 > MAX_EMBEDDING_INPUTS:
            raise _Refused("documents", f"{len(self.documents)} documents is over the limit of "
                                        f"{MAX_EMBEDDING_INPUTS - 1} per request")
        return self


def _path(location: tuple) -> str:
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def parse(model: type[Body], body: bytes) -> Any:
    """The request `model` from a JSON body, or OpenAIError (400) naming the field at fault."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        raise _openai_error(error) from None


def _openai_error(error: ValidationError):
    first = error.errors(include_url=False)[0]
    refused = (first.get("ctx") or {}).get("error")
    if isinstance(refused, _Refused):
        return unsupported(refused.param, refused.why) if refused.param in UNSUPPORTED else \
            invalid(refused.param, f"{refused.param}: {refused.why}")
    kind, location = first["type"], tuple(first["loc"])
    if kind == "json_invalid":
        return invalid(None, f"the body is not valid JSON: {(first.get('ctx') or {}).get('error', first['msg'])}",
                       code="invalid_json")
    if kind == "model_type" or not location:
        return invalid(None, f"the body must be a JSON object, got {_kind(_json_or_none(first.get('input')))}",
                       code="invalid_json")
    param = _path(location)
    if kind == "extra_forbidden":
        return invalid(param, f"Unrecognized request argument supplied: {param}", code="unrecognized_argument")
    if kind == "missing":
        return invalid(param, f"{param}: is required", code="missing_required_parameter")
    message = first["msg"].removeprefix("Value error, ")
    code = "invalid_type" if kind.endswith("_type") or kind.endswith("_parsing") else "invalid_value"
    return invalid(param, f"{param}: {message}", code=code)


def _json_or_none(value: Any) -> Any:
    if isinstance(value, (bytes, str)):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
