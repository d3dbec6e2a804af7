"""A model's chat template rendered as transformers' apply_chat_template(tokenize=False) renders it,
without transformers, which imports torch whenever torch is installed: the OpenAI front must not
load it, and the llm_tokenizer stubs started in 0.5 CPU s instead of 4 without it.

What transformers gives a template, read from its chat_template_utils (5.x) and reproduced here:
- a sandboxed Jinja environment (ImmutableSandboxedEnvironment) with trim_blocks and
  lstrip_blocks, the loop controls extension (break, continue) and a `generation` block tag, which
  renders its body (transformers uses it to mark assistant tokens);
- `tojson` as json.dumps with ensure_ascii false (Jinja's own escapes HTML), taking indent,
  separators and sort_keys; globals raise_exception (a TemplateError with the template's
  message) and strftime_now (the local time, formatted);
- the variables messages (each message without its keys whose value is None), tools, documents
  (None here), add_generation_prompt, and the tokenizer's named special tokens (bos_token,
  eos_token, unk_token, sep_token, pad_token, cls_token, mask_token, and the model-specific ones of
  extra_special_tokens) as strings;
- the template: chat_template.jinja (named templates beside it in additional_chat_templates/),
  else tokenizer_config.json's chat_template (a string, or a list of named templates); of named
  templates, "tool_use" when tools are given and the model has it, else "default".
Special tokens come from tokenizer_config.json (and the legacy special_tokens_map.json); a
tokenizer class's built-in defaults, which transformers adds for a folder that names none, are not
known here. tests/unit/test_chat_template.py compares the result with transformers' own on
conversations with system prompts, tools and tool calls.
"""
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
TEMPLATE_FILE, TEMPLATE_FOLDER = "chat_template.jinja", "additional_chat_templates"


class _GenerationTag(Extension):
    """{% generation %}…{% endgeneration %}: the body as it renders."""
    tags = {"generation"}

    def parse(self, parser):
        line = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(line)

    @staticmethod
    def _body(caller) -> str:
        return caller()


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[_GenerationTag, loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return environment


def _token_text(value: Any) -> Optional[str]:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken's dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(folder: Path) -> dict[str, str]:
    """The named special tokens transformers passes a template, as strings."""
    config = _json(folder / "tokenizer_config.json")
    names = list(NAMED_SPECIAL_TOKENS)
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):  # model-specific tokens (image_token …) are named special tokens too
        names += [name for name in extra if name not in names]
        config = {**extra, **config}
    if "added_tokens_decoder" not in config:  # an old folder: special_tokens_map.json completes the config
        config = {**config, **_json(folder / "special_tokens_map.json")}
    tokens = {name: _token_text(config.get(name)) for name in names}
    return {name: text for name, text in tokens.items() if text is not None}


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _templates(folder: Path) -> Union[None, str, dict[str, str]]:
    named = {}
    if (folder / TEMPLATE_FILE).exists():
        named["default"] = (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
    if (folder / TEMPLATE_FOLDER).is_dir():
        for path in sorted((folder / TEMPLATE_FOLDER).glob("*.jinja")):
            named[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if not named:
        configured = _json(folder / "tokenizer_config.json").get("chat_template")
        if isinstance(configured, list):
            return {entry["name"]: entry["template"] for entry in configured}
        return configured
    return named["default"] if list(named) == ["default"] else named


class ChatTemplate:
    def __init__(self, template: Union[str, Mapping[str, str]], tokens: Mapping[str, str]):
        self.template, self.tokens = template, dict(tokens)
        environment = _environment()
        sources = template if isinstance(template, Mapping) else {"default": template}
        self._compiled = {name: environment.from_string(source) for name, source in sources.items()}

    @classmethod
    def from_folder(cls, folder: Path) -> Optional["ChatTemplate"]:
        """The folder's template, or None when it has none."""
        template = _templates(Path(folder))
        return cls(template, special_tokens(Path(folder))) if template else None

    def source(self, tools: Optional[list] = None) -> str:
        """The template's text that `tools` select (transformers' get_chat_template)."""
        return self.template[self._name(tools)] if isinstance(self.template, Mapping) else self.template

    def _name(self, tools: Optional[list]) -> str:
        if tools is not None and "tool_use" in self._compiled:
            return "tool_use"
        if "default" in self._compiled:
            return "default"
        raise ValueError(f"the model has several chat templates ({', '.join(sorted(self._compiled))}) and none "
                         "named default")

    def render(self, messages: Sequence[Mapping], tools: Optional[list] = None, add_generation_prompt: bool = True,
               **variables: Any) -> str:
        """The conversation as the template writes it; raises jinja2's TemplateError for what the
        template refuses (raise_exception) and ValueError for a model without a default template."""
        turns = [{key: value for key, value in message.items() if value is not None} for message in messages]
        return self._compiled[self._name(tools)].render(messages=turns, tools=tools, documents=None,
                                                        add_generation_prompt=add_generation_prompt,
                                                        **{**self.tokens, **variables})
