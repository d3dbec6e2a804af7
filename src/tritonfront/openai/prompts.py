"""The LLM's prompts in the front: chat prompts (multi-turn, system prompts, tools) rendered through
the model's chat template (chat_template: as transformers renders it, without transformers), and
the LLM's tokenizer (local_tokenizer) for decoding and token strings. How many tokens a prompt
leaves to generate is the llm's to decide (it caps a request without max_tokens), so the front
counts none; the ids a prompt becomes are the llm_tokenizer's (Backend.tokenize).

The generation ensemble takes text: the `llm_tokenizer` model encodes a raw prompt with the special
tokens the tokenizer's post-processor adds (as `tokenizer(text)` does). A rendered chat template
already holds its special tokens as text, and `apply_chat_template(tokenize=True)` encodes it
without adding any; so the front removes from the rendered text the prefix the post-processor would
add again (a BOS written by the template), and the ensemble then sees the same ids as
`apply_chat_template(tokenize=True)` gives. A tokenizer whose post-processor appends tokens (rare
for causal LMs) cannot be matched that way: chat prompts then end with those tokens, and the front
says so at start-up.
"""
import logging
from pathlib import Path
from typing import Optional, Sequence

from jinja2 import TemplateError

from ..core.tokenization import CHAT_ROLES
from .api_errors import invalid
from ..core.chat_template import ChatTemplate
from .local_tokenizer import LocalTokenizer
from .tools import template_takes_tools

log = logging.getLogger("tritonfront.openai")


class Prompts:
    def __init__(self, tokenizer: LocalTokenizer, template: Optional[ChatTemplate]):
        self.tokenizer, self.template = tokenizer, template
        self.has_chat_template = template is not None
        self.template_takes_tools = template_takes_tools(template.source() if template else None)
        self._added_prefix = tokenizer.decode(tokenizer.added_prefix_ids)
        if tokenizer.added_suffix_ids:
            log.warning("the LLM's tokenizer appends %r to every prompt it encodes; chat prompts rendered here "
                        "reach the model with it", tokenizer.decode(tokenizer.added_suffix_ids))

    @classmethod
    def from_folder(cls, model_dir: Path) -> "Prompts":
        return cls(LocalTokenizer.from_folder(model_dir), ChatTemplate.from_folder(model_dir))

    def render(self, messages: Sequence[dict], tools: Optional[list] = None, add_generation_prompt: bool = True) -> str:
        """The template's text for `messages` ({"role", "content"[, "name"]}; OpenAI's developer role is
        the templates' system role) and, for a template that takes them, `tools`."""
        turns = [{**message, "role": CHAT_ROLES.get(message["role"], message["role"])} for message in messages]
        try:
            return self.template.render(turns, tools, add_generation_prompt=add_generation_prompt)
        except TemplateError as error:  # the template's raise_exception: a conversation it does not take
            raise invalid("messages", f"messages: the model's chat template refuses them: {error}") from None

    def chat(self, messages: Sequence[dict], tools: Optional[list] = None, add_generation_prompt: bool = True) -> str:
        """The raw prompt the ensemble takes for `messages`: the rendered template (with the
        assistant's turn opened), less the prefix the ensemble's tokenizer adds back."""
        text = self.render(messages, tools, add_generation_prompt)
        if self._added_prefix and text.startswith(self._added_prefix):
            text = text[len(self._added_prefix):]
        return text
