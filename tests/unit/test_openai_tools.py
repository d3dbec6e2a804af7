"""Tool calling's pure logic: request checks, prompts, guides, and the text -> tool_calls parser
(streamed and whole answers built from the same deltas)."""
import json

import jsonschema
import pytest
import xgrammar

from tritonfront.openai import tools
from tritonfront.openai.api_errors import OpenAIError

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


def request(choice=None, parallel=None, declared=(WEATHER, TIME)):
    return tools.parse_request(list(declared), choice, parallel)


def error_of(*args) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        tools.parse_request(*args)
    return caught.value


def test_choices_parse():
    assert tools.parse_request(None, None, None) is None
    assert tools.parse_request([], "none", None) is None
    assert request().choice == "auto"
    assert request("required", False).parallel is False
    named = request({"type": "function", "function": {"name": "get_time"}})
    assert (named.choice, named.named, named.forced) == ("function", "get_time", True)
    no_parameters = tools.parse_request([{"type": "function", "function": {"name": "ping"}}], "auto", None)
    assert no_parameters.functions[0].parameters == {"type": "object", "properties": {}}


@pytest.mark.parametrize("args, param", [
    (([], "required", None), "tool_choice"),
    (([WEATHER], "sometimes", None), "tool_choice"),
    (([WEATHER], {"type": "function", "function": {"name": "nope"}}, None), "tool_choice"),
    (([WEATHER], {"type": "function"}, None), "tool_choice"),
    (([{"type": "code_interpreter"}], None, None), "tools[0]"),
    (([{"type": "function", "function": {"name": "a b"}}], None, None), "tools[0].function.name"),
    (([WEATHER, WEATHER], None, None), "tools[1].function.name"),
    (([{"type": "function", "function": {"name": "a", "parameters": []}}], None, None), "tools[0].function.parameters"),
    (([{"type": "function", "function": {"name": "a", "extra": 1}}], None, None), "tools[0].function.extra"),
])
def test_bad_requests_name_the_field(args, param):
    error = error_of(*args)
    assert error.status == 400 and error.param == param, error.body()


def test_template_detection():
    assert tools.template_takes_tools("{% if tools %}{{ tools | tojson }}{% endif %}{{ messages }}")
    assert not tools.template_takes_tools("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert not tools.template_takes_tools(None)


HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
]


def test_default_prompt_renders_tools_calls_and_results_as_text():
    turns, passed = tools.prompt_messages(HISTORY, request(), template_tools=False)
    assert passed is None
    assert turns[0]["role"] == "system" and '"name": "get_weather"' in turns[0]["content"]
    assert "<tools>" in turns[0]["content"] and "<tool_call>" in turns[0]["content"]
    assert turns[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "get_weather", "arguments": '
                                                        '{"city": "Paris", "unit": "celsius"}}\n</tool_call>'}
    assert turns[3] == {"role": "user", "content": '<tool_response>\n{"temperature": 21}\n</tool_response>'}
    # a system turn of the client's keeps its text first
    turns, _ = tools.prompt_messages([{"role": "system", "content": "Be brief."}, *HISTORY], request(), False)
    assert turns[0]["content"].startswith("Be brief.\n\n") and len(turns) == 4
    # tool_choice none: no tools offered, the history still readable
    turns, _ = tools.prompt_messages(HISTORY, request("none"), template_tools=False)
    assert turns[0]["role"] == "user"


def test_template_with_tools_gets_them_and_argument_objects():
    turns, passed = tools.prompt_messages(HISTORY, request(), template_tools=True)
    assert [t["function"]["name"] for t in passed] == ["get_weather", "get_time"]
    assert turns[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris", "unit": "celsius"}
    assert turns[2]["tool_call_id"] == "call_1"
    assert tools.prompt_messages(HISTORY, request("none"), True)[1] is None


def matches(grammar_text: str, text: str) -> bool:
    """Whether xgrammar's matcher accepts `text` whole under the grammar."""
    grammar = xgrammar.Grammar.from_ebnf(grammar_text)
    return xgrammar.testing._is_grammar_accept_string(grammar, text)


def test_guides_accept_only_valid_calls():
    assert request("auto").guide() is None
    kind, grammar = request({"type": "function", "function": {"name": "get_weather"}}).guide()
    assert kind == "ebnf_grammar"
    assert matches(grammar, '{"city": "Paris", "unit": "celsius"}')
    assert not matches(grammar, '{"city": "Paris"}')
    assert not matches(grammar, '{"city": "Paris", "unit": "kelvin"}')
    assert not matches(grammar, '{ "city": "Paris", "unit": "celsius"}')  # no free whitespace

    _, grammar = request("required").guide()
    one = '{"name": "get_time", "arguments": {"zone": "UTC"}}'
    two = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
    assert matches(grammar, f"[{one}]") and matches(grammar, f"[{one}, {two}]")
    assert not matches(grammar, "[]")
    assert not matches(grammar, '[{"name": "get_time", "arguments": {"city": "Oslo"}}]')
    _, single = request("required", parallel=False).guide()
    assert matches(single, f"[{one}]") and not matches(single, f"[{one}, {two}]")


def test_a_schema_that_does_not_compile_is_named():
    bad = {"type": "function", "function": {"name": "bad", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}
    with pytest.raises(OpenAIError) as caught:
        tools.parse_request([TIME, bad], "required", None).guide()
    assert caught.value.param == "tools[1].function.parameters"
    assert "nonsense" in caught.value.message


def run(tool_request, chunks, finish="stop"):
    """Feeds `chunks`; returns (every delta, the reported finish_reason)."""
    calls = tools.ToolCalls(tool_request)
    deltas = [d for chunk in chunks for d in calls.feed(chunk)]
    last, reason = calls.finish(finish)
    return deltas + last, reason


def chunked(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


HERMES = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
          '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>')


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_auto_parses_hermes_calls_whatever_the_chunking(size):
    deltas, reason = run(request(), chunked(HERMES, size))
    message = tools.assemble(deltas)
    assert reason == "tool_calls"
    assert message["content"] == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"zone": "CET"})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message["tool_calls"])
    assert len({c["id"] for c in message["tool_calls"]}) == 2
    # the content came out before the calls, the calls one delta each
    content = [d for d in deltas if "content" in d]
    assert deltas[:len(content)] == content and len(deltas) == len(content) + 2


def test_auto_without_parallel_keeps_the_first_call():
    deltas, _ = run(tools.parse_request([WEATHER, TIME], "auto", False), [HERMES])
    assert [c["function"]["name"] for c in tools.assemble(deltas)["tool_calls"]] == ["get_weather"]


def test_auto_bare_json_call():
    deltas, reason = run(request(), ['  {"name": "get_time", ', '"parameters": {"zone": "UTC"}}'])
    assert reason == "tool_calls"
    assert tools.assemble(deltas)["tool_calls"][0]["function"] == {"name": "get_time",
                                                                   "arguments": '{"zone": "UTC"}'}


@pytest.mark.parametrize("text", [
    "Paris is sunny. x < y and <tool maybe",
    "<tool_call>\n{not json}\n</tool_call>",
    '<tool_call>\n{"name": "unknown", "arguments": {}}\n</tool_call>',
    '{"a": 1}',
    "ends with a half tag <tool_c",
    "   spaced   \n",
])
@pytest.mark.parametrize("size", [1, 4, 1000])
def test_auto_falls_back_to_the_text_unchanged(text, size):
    deltas, reason = run(request(), chunked(text, size))
    assert reason == "stop"
    assert tools.assemble(deltas) == {"role": "assistant", "content": text}


def test_plain_content_streams_as_it_comes():
    calls = tools.ToolCalls(request())
    assert calls.feed("Hello") == [{"content": "Hello"}]
    assert calls.feed(" there ") == [{"content": " there"}]  # trailing space waits
    assert calls.feed("<") == []  # may open a call
    assert calls.feed("b>") == [{"content": " <b>"}]


def test_named_streams_argument_fragments():
    named = request({"type": "function", "function": {"name": "get_weather"}})
    text = '{"city": "Rome", "unit": "celsius"}'
    deltas, reason = run(named, chunked(text, 5))
    assert reason == "tool_calls"
    first = deltas[0]["tool_calls"][0]
    assert first["index"] == 0 and first["id"].startswith("call_") and first["function"]["name"] == "get_weather"
    assert all(set(d["tool_calls"][0]) == {"index", "function"} for d in deltas[1:])
    message = tools.assemble(deltas)
    assert message["content"] is None and message["tool_calls"][0]["function"]["arguments"] == text
    assert run(named, [text[:10]], "length")[1] == "length"


def test_required_parses_the_array_and_validates():
    text = ('[{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}, '
            '{"name": "get_time", "arguments": {"zone": "CET"}}]')
    deltas, reason = run(request("required"), chunked(text, 9))
    message = tools.assemble(deltas)
    assert reason == "tool_calls" and message["content"] is None
    assert [d["tool_calls"][0]["index"] for d in deltas] == [0, 1]
    for call in message["tool_calls"]:
        schema = next(t for t in (WEATHER, TIME) if t["function"]["name"] == call["function"]["name"])
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema["function"]["parameters"])
    cut = text[:30]
    deltas, reason = run(request("required"), [cut], "length")
    assert reason == "length" and tools.assemble(deltas) == {"role": "assistant", "content": cut}
    # parallel calls that run on until max_tokens: the ones completed before the cut
    cut = text + ', {"name": "get_time", "argum'
    deltas, reason = run(request("required"), chunked(cut, 4), "length")
    message = tools.assemble(deltas)
    assert reason == "length" and message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather", "get_time"]
