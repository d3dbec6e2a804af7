"""text-embeddings-inference's (TEI's) wire schemas and errors, for the routes its clients call
(LangChain's and llama-index's TEI embeddings post to /embed or to the server's root): request
bodies as TEI's router reads them (router/src/http/types.rs) and errors as it answers them,
`{"error": <message>, "error_type": <kind>}` with the kind's status: Empty 400, Validation and
Tokenizer 422, Backend 424, Overloaded 429, Unhealthy 503.

TEI ignores fields it does not know (serde's default); here an unknown field is refused, naming
it, as everywhere in the front, so a misspelled option never goes unused. A body that is not JSON
is a 400 and a field of the wrong shape a 422 (TEI's JSON extractor answers the same statuses, in
plain text); both name what is wrong.
"""
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from .protocol import INT32_MAX, MAX_EMBEDDING_INPUTS, _kind, _path

STATUS = {"Empty": 400, "Validation": 422, "Tokenizer": 422, "Backend": 424, "Overloaded": 429, "Unhealthy": 503}
MAX_CLIENT_BATCH = MAX_EMBEDDING_INPUTS  # TEI's --max-client-batch-size; here the OpenAI route's limit


class TEIError(Exception):
    def __init__(self, error_type: str, message: str, retry_after: Optional[int] = None,
                 status: Optional[int] = None):
        super().__init__(message)
        self.error_type, self.message, self.retry_after = error_type, message, retry_after
        self.status = status or STATUS[error_type]

    def body(self) -> dict:
        return {"error": self.message, "error_type": self.error_type}

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


def validation(message: str) -> TEIError:
    """An input TEI's core refuses: its message carries TEI's prefix."""
    return TEIError("Validation", f"Input validation error: {message}")


def empty(field: str) -> TEIError:
    return TEIError("Empty", f"`{field}` cannot be empty")


def check_batch(size: int) -> None:
    if size > MAX_CLIENT_BATCH:
        raise TEIError("Validation", f"batch size {size} > maximum allowed batch size {MAX_CLIENT_BATCH}")


class TEIBody(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)


Direction = Literal["left", "Left", "right", "Right"]


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT32_MAX


def _embed_inputs(value: Any) -> Any:
    """TEI's Input: a string, a list of token ids, or a batch whose items are strings or lists of
    token ids (mixed); returned as a list of items."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(_is_id(item) for item in value):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) or (isinstance(item, list) and item and all(
            _is_id(i) for i in item)) for item in value):
        return value
    raise ValueError("must be a string, a list of token ids, or a list of strings and lists of token ids (integers "
                     f"in 0..{INT32_MAX}), got {_kind(value)}")


class TEIEmbedRequest(TEIBody):
    inputs: Annotated[list[Union[str, list[int]]], BeforeValidator(_embed_inputs)]
    truncate: Optional[bool] = None
    truncation_direction: Direction = "right"
    prompt_name: Optional[str] = None
    normalize: bool = True
    dimensions: Optional[int] = Field(None, ge=0, le=INT32_MAX)


class SimilarityInput(TEIBody):
    source_sentence: str
    sentences: list[str]


class SimilarityParameters(TEIBody):
    truncate: Optional[bool] = None
    truncation_direction: Direction = "right"
    prompt_name: Optional[str] = None


class TEISimilarityRequest(TEIBody):
    inputs: SimilarityInput
    parameters: Optional[SimilarityParameters] = None


def _strings(value: Any) -> Any:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise ValueError(f"must be a string or a list of strings, got {_kind(value)}")


class TEITokenizeRequest(TEIBody):
    inputs: Annotated[list[str], BeforeValidator(_strings)]
    add_special_tokens: bool = True
    prompt_name: Optional[str] = None


def _id_lists(value: Any) -> Any:
    if isinstance(value, list) and all(_is_id(item) for item in value):
        return [value]
    if isinstance(value, list) and all(isinstance(item, list) and all(_is_id(i) for i in item) for item in value):
        return value
    raise ValueError(f"must be a list of token ids or a list of lists of token ids (integers in 0..{INT32_MAX}), "
                     f"got {_kind(value)}")


class TEIDecodeRequest(TEIBody):
    ids: Annotated[list[list[int]], BeforeValidator(_id_lists)]
    skip_special_tokens: bool = True


class TEIRerankRequest(TEIBody):
    query: str
    texts: list[str]
    truncate: Optional[bool] = None
    truncation_direction: Direction = "right"
    raw_scores: bool = False
    return_text: bool = False


def parse(model: type[TEIBody], body: bytes) -> Any:
    """The request `model` from a JSON body, or TEIError naming what is wrong."""
    try:
        return model.model_validate_json(body)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        kind, location = first["type"], tuple(first["loc"])
        if kind == "json_invalid":
            raise TEIError("Validation", "Failed to parse the request body as JSON: "
                                         f"{(first.get('ctx') or {}).get('error', first['msg'])}", status=400) from None
        if kind == "model_type" or not location:
            raise TEIError("Validation", "the body must be a JSON object", status=400) from None
        field = _path(location)
        if kind == "extra_forbidden":
            raise TEIError("Validation", f"{field}: unknown field") from None
        if kind == "missing":
            raise TEIError("Validation", f"{field}: missing field") from None
        raise TEIError("Validation", f"{field}: {first['msg'].removeprefix('Value error, ')}") from None
