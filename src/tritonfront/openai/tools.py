"""Tool calling on /v1/chat/completions: the request's `tools` and `tool_choice` checked, the
prompt they add, the guide that constrains a forced call, and the model's text turned into
`tool_calls`.

- Prompt: a chat template that takes `tools` (its source uses the variable) gets them, and the
  history's tool calls and results, as Hugging Face's template convention has them (arguments as
  objects). A template that does not (the bundled SmolLM2's) gets DEFAULT_TOOL_PROMPT in the
  system turn, the history's calls written in that prompt's format and the tool results as user
  turns, since a template without tools may refuse a role it does not know.
- tool_choice "none": tools are left out of the prompt and the text is content.
  "auto": the text is parsed for calls in the prompt's format (Hermes' `<tool_call>{json}</tool_call>`
  blocks, which the default prompt asks for and most templates with tools use, or one bare
  `{"name", "arguments"}` object, Llama 3's form); a text that does not parse as calls of the
  declared tools is plain content.
  "required" and a named function: the output is constrained by a guide built from a JSON
  schema (xgrammar's grammar of it, sent as an `ebnf_grammar` guide that the engine enforces), so
  the call always parses and its arguments validate against the function's schema: a named
  function's schema is its parameters (the text is the arguments, streamed as they come); for
  "required" an array of {"name": <one of the tools>, "arguments": <its parameters>} objects (one
  at most without parallel_tool_calls). Only max_tokens can cut a forced call short: its
  finish_reason is then "length" (a named call's arguments incomplete; for "required" the calls
  completed before the cut, each valid, or the text as content when none was).
- ToolCalls reads one choice's text as it arrives and gives the OpenAI `delta`s to send; the whole
  answer is built from the same deltas (`assemble`), so a streamed answer joined equals the whole.
"""
import concurrent.futures
import functools
import json
import multiprocessing
import re
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..engines.guided import client_message
from .api_errors import invalid

DEFAULT_TOOL_PROMPT = """You may call one or more functions to answer the user. The functions are \
described inside <tools></tools> as JSON schemas:
<tools>
{tools}
</tools>
To call a function, reply with one JSON object per call, each inside <tool_call></tool_call> tags:
<tool_call>
{{"name": <function-name>, "arguments": <arguments-object>}}
</tool_call>"""
TOOL_RESULT = "<tool_response>\n{content}\n</tool_response>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
_CALLS = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|$)", re.S)
CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Function:
    name: str
    description: Optional[str]
    parameters: dict

    def as_tool(self) -> dict:
        function = {"name": self.name, "parameters": self.parameters}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    functions: tuple[Function, ...]
    choice: str  # "none", "auto", "required", or "function" (then `named`)
    named: Optional[str] = None
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")

    def schema(self) -> Optional[dict]:
        """The JSON schema a forced call's text follows; None when not forced."""
        if self.choice == "function":
            return self.function(self.named).parameters
        if self.choice != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                  "required": ["name", "arguments"], "additionalProperties": False} for f in self.functions]
        schema = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls}, "minItems": 1}
        if not self.parallel:
            schema["maxItems"] = 1
        return schema

    def guide(self) -> Optional[tuple[str, str]]:
        """(guide type, guide) for the generation contract, None when not forced: the schema as an
        xgrammar EBNF grammar without free whitespace (one space after ':' and ','), which a JSON-schema
        guide would allow anywhere; a small model can spend every token on it and never close the call."""
        schema = self.schema()
        if schema is None:
            return None
        for i, function in enumerate(self.functions):  # a schema that does not compile, named
            if self.choice == "required" or function.name == self.named:
                _grammar(function.parameters, f"tools[{i}].function.parameters")
        return "ebnf_grammar", _grammar(schema, "tools")

    def function(self, name: str) -> Function:
        return next(f for f in self.functions if f.name == name)


# xgrammar's package imports torch (its matcher module), which the front otherwise never loads
# (~400 MB and seconds of start-up): schemas compile in one worker process, started at the first
# request with tools and reused; the front keeps a grammar per schema text.
_compiler: Optional[concurrent.futures.ProcessPoolExecutor] = None
_compiler_lock = threading.Lock()


def compile_json_schema(schema: str) -> tuple[bool, str]:
    """In the worker: (True, the schema's EBNF grammar without free whitespace) or (False, why it
    does not compile, as a client may read it)."""
    import xgrammar

    try:
        return True, str(xgrammar.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True))
    except Exception as error:  # xgrammar raises RuntimeError with the converter's message
        return False, client_message(error)


@functools.lru_cache(maxsize=256)
def _compiled(schema: str) -> tuple[bool, str]:
    global _compiler
    with _compiler_lock:
        if _compiler is None:
            _compiler = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    return _compiler.submit(compile_json_schema, schema).result()


def _grammar(schema: dict, where: str) -> str:
    compiled, text = _compiled(json.dumps(schema))  # key order kept: it is the order of the JSON generated
    if not compiled:
        raise invalid(where, f"{where}: the schema does not compile: {text}")
    return text


def _parameters(value: Any, where: str) -> dict:
    if value is None:
        return {"type": "object", "properties": {}}  # OpenAI: no parameters is an empty parameter list
    if not isinstance(value, dict):
        raise invalid(where, f"{where}: must be a JSON schema object")
    return value


def parse_request(tools: Optional[list], tool_choice: Any, parallel_tool_calls: Optional[bool]) -> Optional[ToolRequest]:
    """The request's tool fields checked; None when it declares no tools (and asks for none)."""
    if not tools:
        if tool_choice not in (None, "none"):
            raise invalid("tool_choice", "tool_choice: is only allowed when tools are given")
        return None
    functions, names = [], set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise invalid(where, f"{where}: must be {{\"type\": \"function\", \"function\": {{...}}}}")
        extra = set(tool) - {"type", "function"}
        if extra:
            raise invalid(f"{where}.{sorted(extra)[0]}", f"Unrecognized request argument supplied: "
                                                         f"{where}.{sorted(extra)[0]}")
        spec = tool["function"]
        extra = set(spec) - {"name", "description", "parameters", "strict"}
        if extra:
            raise invalid(f"{where}.function.{sorted(extra)[0]}",
                          f"Unrecognized request argument supplied: {where}.function.{sorted(extra)[0]}")
        name = spec.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise invalid(f"{where}.function.name", f"{where}.function.name: must be 1 to 64 letters, digits, "
                                                    f"underscores or dashes, got {name!r}")
        if name in names:
            raise invalid(f"{where}.function.name", f"{where}.function.name: {name!r} is declared twice")
        description = spec.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid(f"{where}.function.description", f"{where}.function.description: must be a string")
        names.add(name)
        functions.append(Function(name, description, _parameters(spec.get("parameters"),
                                                                  f"{where}.function.parameters")))
    if tool_choice is None:
        choice, named = "auto", None
    elif isinstance(tool_choice, str):
        if tool_choice not in CHOICES:
            raise invalid("tool_choice", f"tool_choice: must be one of {', '.join(CHOICES)} or "
                                         f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {tool_choice!r}")
        choice, named = tool_choice, None
    else:
        function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
        named = function.get("name") if isinstance(function, dict) else None
        if tool_choice.get("type") != "function" or not isinstance(named, str):
            raise invalid("tool_choice", "tool_choice: must be one of none, auto, required or "
                                         "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        if named not in names:
            raise invalid("tool_choice", f"tool_choice: function {named!r} is not among tools "
                                         f"({', '.join(sorted(names))})")
        choice = "function"
    return ToolRequest(tuple(functions), choice, named, parallel_tool_calls is not False)


def template_takes_tools(chat_template: Optional[str]) -> bool:
    """Whether a chat template reads the `tools` variable (Hugging Face's name for it)."""
    if not chat_template:
        return False
    from jinja2 import Environment, meta

    return "tools" in meta.find_undeclared_variables(Environment().parse(chat_template))


def _arguments_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # a template renders what it is given; a malformed history is the client's


def _call_text(call: dict) -> str:
    function = call["function"]
    return f"{CALL_OPEN}\n" + json.dumps({"name": function["name"], "arguments": _arguments_object(
        function["arguments"])}, ensure_ascii=False) + f"\n{CALL_CLOSE}"


def prompt_messages(messages: Sequence[dict], tools: Optional[ToolRequest], template_tools: bool) -> tuple[list, Optional[list]]:
    """(the messages to render, the `tools` to pass to the template or None).

    `messages` are the request's ({"role", "content", "tool_calls", "tool_call_id", "name"}).
    """
    offered = tools if tools is not None and tools.choice != "none" else None
    if template_tools:
        turns = []
        for message in messages:
            message = dict(message)
            if message.get("tool_calls"):
                message["tool_calls"] = [{**call, "function": {**call["function"], "arguments": _arguments_object(
                    call["function"]["arguments"])}} for call in message["tool_calls"]]
            turns.append(message)
        return turns, [f.as_tool() for f in offered.functions] if offered else None
    turns = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "tool":
            turns.append({"role": "user", "content": TOOL_RESULT.format(content=content)})
        elif message.get("tool_calls"):
            calls = "\n".join(_call_text(call) for call in message["tool_calls"])
            turns.append({"role": "assistant", "content": f"{content}\n{calls}" if content else calls})
        else:
            turns.append({key: value for key, value in message.items() if key in ("role", "content", "name")})
    if offered:
        system = DEFAULT_TOOL_PROMPT.format(tools="\n".join(json.dumps(f.as_tool(), ensure_ascii=False)
                                                            for f in offered.functions))
        if turns and turns[0]["role"] in ("system", "developer"):
            turns[0] = {**turns[0], "content": f"{turns[0]['content']}\n\n{system}"}
        else:
            turns.insert(0, {"role": "system", "content": system})
    return turns, None


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call(name: str, arguments: Any) -> Optional[tuple[str, str]]:
    if not isinstance(arguments, dict):
        return None
    return name, json.dumps(arguments, ensure_ascii=False)


def parse_calls(text: str, functions: Sequence[Function]) -> Optional[list[tuple[str, str]]]:
    """The calls (name, arguments JSON) in a model's text, or None when it holds none that parse:
    Hermes blocks, or one bare {"name", "arguments"|"parameters"} object."""
    names = {f.name for f in functions}
    blocks = _CALLS.findall(text) if CALL_OPEN in text else [text.strip()]
    calls = []
    for block in blocks:
        try:
            value = json.loads(block)
        except ValueError:
            return None
        if not isinstance(value, dict) or value.get("name") not in names:
            return None
        call = _call(value["name"], value.get("arguments", value.get("parameters")))
        if call is None:
            return None
        calls.append(call)
    return calls or None


def _complete_items(text: str) -> list:
    """The items of a JSON array written as the guide of "required" writes it ("[a, b]"), up to the
    last complete one: an array cut by max_tokens still gives the calls finished before the cut."""
    decoder, items = json.JSONDecoder(), []
    at = text.find("[") + 1
    if at == 0:
        return items
    while True:
        try:
            item, end = decoder.raw_decode(text, at)
        except ValueError:
            return items
        items.append(item)
        rest = text[end:].lstrip()
        if not rest.startswith(","):
            return items
        at = len(text) - len(rest) + 1
        while at < len(text) and text[at].isspace():
            at += 1


def _partial_open(text: str) -> int:
    """Where `text` ends with the start of an opening tag cut short; len(text) when it does not."""
    for size in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-size:]):
            return len(text) - size
    return len(text)


@dataclass
class ToolCalls:
    """One choice's text read as it arrives (`feed`), ended by `finish`: each returns the deltas
    ({"content": ...} or {"tool_calls": [...]}) to send for it."""
    tools: ToolRequest
    text: str = ""
    sent: int = 0  # characters of `text` already sent as content
    held: bool = False  # auto: a call may have begun; the rest waits for the end
    calls: int = 0
    call_id: Optional[str] = None

    def feed(self, text: str) -> list[dict]:
        self.text += text
        if self.tools.choice == "function":
            return self._named(text)
        if self.tools.choice == "required" or self.held:
            return []
        pending = self.text[self.sent:]
        if self.sent == 0 and pending.lstrip().startswith("{"):  # a bare JSON call, perhaps
            self.held = True
            return []
        at = pending.find(CALL_OPEN)
        if at >= 0:
            self.held = True
        else:
            at = _partial_open(pending)
        # Trailing whitespace waits for what follows: before a call it is dropped.
        ready = pending[:at].rstrip()
        self.sent += len(ready)
        return [{"content": ready}] if ready else []

    def _named(self, text: str) -> list[dict]:
        if self.call_id is None:
            self.call_id, self.calls = new_call_id(), 1
            return [{"tool_calls": [{"index": 0, "id": self.call_id, "type": "function",
                                     "function": {"name": self.tools.named, "arguments": text}}]}]
        return [{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}] if text else []

    def finish(self, finish_reason: Optional[str]) -> tuple[list[dict], Optional[str]]:
        """(the last deltas, the finish_reason to report)."""
        if self.tools.choice == "function":
            deltas = self._named("") if self.call_id is None else []
            return deltas, "tool_calls" if finish_reason == "stop" else finish_reason
        rest = self.text[self.sent:]
        if self.tools.choice == "auto" and not self.held:
            self.sent = len(self.text)
            return ([{"content": rest}] if rest else []), finish_reason
        calls = None
        if self.tools.choice == "required":
            calls = [c for c in (_call(item.get("name"), item.get("arguments")) for item in _complete_items(self.text)
                                 if isinstance(item, dict)) if c] or None
        else:
            calls = parse_calls(rest, self.tools.functions)
            if calls and not self.tools.parallel:
                calls = calls[:1]
        if not calls:
            self.sent = len(self.text)
            return ([{"content": rest}] if rest else []), finish_reason
        self.sent, self.calls = len(self.text), len(calls)
        deltas = [{"tool_calls": [{"index": i, "id": new_call_id(), "type": "function",
                                   "function": {"name": name, "arguments": arguments}}]}
                  for i, (name, arguments) in enumerate(calls)]
        return deltas, "tool_calls" if finish_reason == "stop" else finish_reason


def assemble(deltas: Sequence[dict]) -> dict:
    """The whole answer's message from a choice's deltas: content (None when there is none) and
    tool_calls (left out when there are none)."""
    content, calls = [], {}
    for delta in deltas:
        if delta.get("content"):
            content.append(delta["content"])
        for call in delta.get("tool_calls", ()):
            whole = calls.setdefault(call["index"], {"id": None, "type": "function",
                                                     "function": {"name": None, "arguments": ""}})
            whole["id"] = call.get("id", whole["id"])
            function = call.get("function", {})
            whole["function"]["name"] = function.get("name", whole["function"]["name"])
            whole["function"]["arguments"] += function.get("arguments", "")
    message = {"role": "assistant", "content": "".join(content) if content else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message
