"""Chat templates rendered without transformers (tritonfront.core.chat_template, used by the llm_tokenizer
and the OpenAI front): the text equals transformers' apply_chat_template(tokenize=False) on
conversations with system prompts, several turns, tools, tool calls and tool results, for the bundled
LLM's template and for a tool-using template that exercises what transformers gives templates (tojson
and its options, namespace, loop controls, the generation tag, raise_exception, strftime_now, special
tokens), with named templates chosen as transformers chooses them and read from a folder as transformers
saves it."""
import json

import jinja2
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tritonfront.core import model_sources
from tritonfront.core.chat_template import ChatTemplate, special_tokens

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Città, e.g. Köln"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time",
                                         "parameters": {"type": "object", "properties": {}}}}
CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "What is the capital of France?"}],
    "system and turns": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy? <b>bold</b> & \"quotes\""}],
    "tool calls and results": [
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "Weather in Köln?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": {"city": "Köln", "unit": "c"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"},
        {"role": "user", "content": "Thanks"}],
}

# A template in the style of today's tool-calling models (Hermes/Qwen-like), using what transformers
# hands templates.
TOOL_TEMPLATE = """{{ bos_token }}
{%- set ns = namespace(system=none, turns=0) %}
{%- for message in messages %}
    {%- if message.role == 'system' %}{% set ns.system = message.content %}{% endif %}
{%- endfor %}
{%- if tools %}
<|system|>{{ ns.system or 'You are helpful.' }} Today is {{ strftime_now('%Y') }}.
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
{{ tools | tojson(indent=2, sort_keys=true) }}<|end|>
{%- elif ns.system %}
<|system|>{{ ns.system }}<|end|>
{%- endif %}
{% for message in messages %}
    {%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}
        {{- raise_exception('unknown role ' + message.role) }}
    {%- endif %}
    {%- if message.role == 'system' %}{% continue %}{% endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {%- if message.role == 'assistant' %}
<|assistant|>{% generation %}{{ message.content or '' }}
        {%- for call in message.tool_calls or [] %}
<tool_call>{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson(separators=(',', ':')) }}</tool_call>
        {%- endfor %}{{ eos_token }}{% endgeneration %}
    {%- elif message.role == 'tool' %}
<|tool|>{{ message.content }} ({{ message.tool_call_id }})<|end|>
    {%- else %}
<|user|>{{ message.content }}<|end|>
    {%- endif %}
    {%- if ns.turns > 20 %}{% break %}{% endif %}
{% endfor %}
{%- if add_generation_prompt %}<|assistant|>{% endif %}"""


def word_tokenizer(template) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = template
    return tokenizer


def transformers_text(tokenizer, messages, tools=None, add_generation_prompt=True) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


@pytest.fixture(scope="module")
def bundled():
    folder = model_sources.llm_model_dir()
    return ChatTemplate.from_folder(folder), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_bundled_llms_template_renders_as_transformers(bundled, name, add_generation_prompt):
    template, tokenizer = bundled
    messages = [m for m in CONVERSATIONS[name] if m.get("content") is not None]  # the template reads content
    assert template.render(messages, add_generation_prompt=add_generation_prompt) == \
        transformers_text(tokenizer, messages, add_generation_prompt=add_generation_prompt)


def test_the_bundled_llms_special_tokens_are_transformers():
    folder = model_sources.llm_model_dir()
    assert special_tokens(folder) == AutoTokenizer.from_pretrained(folder).special_tokens_map


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
@pytest.mark.parametrize("tools", [None, [WEATHER, TIME]])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_a_tool_template_renders_as_transformers(name, tools, add_generation_prompt):
    tokenizer = word_tokenizer(TOOL_TEMPLATE)
    ours = ChatTemplate(TOOL_TEMPLATE, tokenizer.special_tokens_map)
    expected = transformers_text(tokenizer, CONVERSATIONS[name], tools, add_generation_prompt)
    assert ours.render(CONVERSATIONS[name], tools, add_generation_prompt=add_generation_prompt) == expected
    if tools:
        assert "Köln" in expected and "\\u" not in expected  # tojson keeps non-ASCII text as it is


def test_what_the_template_refuses_it_refuses_as_in_transformers():
    tokenizer = word_tokenizer(TOOL_TEMPLATE)
    messages = [{"role": "narrator", "content": "Once"}]
    with pytest.raises(jinja2.TemplateError) as theirs:
        transformers_text(tokenizer, messages)
    with pytest.raises(jinja2.TemplateError) as ours:
        ChatTemplate(TOOL_TEMPLATE, tokenizer.special_tokens_map).render(messages)
    assert str(ours.value) == str(theirs.value) == "unknown role narrator"


NAMED = {"default": "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}",
         "tool_use": "TOOLS {{ tools | map(attribute='function.name') | join(',') }}\n"
                     "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"}


@pytest.mark.parametrize("tools", [None, [WEATHER, TIME]])
def test_named_templates_saved_by_transformers_are_read_and_chosen_as_transformers_does(tmp_path, tools):
    tokenizer = word_tokenizer(dict(NAMED))
    tokenizer.save_pretrained(tmp_path)  # chat_template.jinja and additional_chat_templates/tool_use.jinja
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    ours = ChatTemplate.from_folder(tmp_path)
    messages = CONVERSATIONS["system and turns"]
    assert ours.render(messages, tools) == transformers_text(reloaded, messages, tools)
    assert ours.render(messages, tools).startswith("TOOLS" if tools else "[system]")


def test_a_template_list_in_tokenizer_config_is_read_as_transformers_reads_it(tmp_path):
    word_tokenizer(None).save_pretrained(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = [{"name": name, "template": text} for name, text in NAMED.items()]
    config_file.write_text(json.dumps(config))
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    ours = ChatTemplate.from_folder(tmp_path)
    messages = CONVERSATIONS["one user turn"]
    for tools in (None, [WEATHER]):
        assert ours.render(messages, tools) == transformers_text(reloaded, messages, tools)


def test_a_folder_without_a_template_has_none(tmp_path):
    word_tokenizer(None).save_pretrained(tmp_path)
    assert ChatTemplate.from_folder(tmp_path) is None
