"""The LLM's tokenizer in the front: chat prompts (multi-turn, system prompts; rendered by the core
library's render_chat, as the llm_tokenizer renders its own). How many tokens a prompt leaves to
generate is the llm's to decide (it caps a request without max_tokens), so the front counts none.

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

from ..core.tokenization import render_chat
from .tools import template_takes_tools

log = logging.getLogger("tritonfront.openai")


class Prompts:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self.template_takes_tools = template_takes_tools(getattr(tokenizer, "chat_template", None))
        with_special = tokenizer("a", add_special_tokens=True)["input_ids"]
        plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        start = next((i for i in range(len(with_special) - len(plain) + 1)
                      if with_special[i:i + len(plain)] == plain), 0)
        self._added_prefix = tokenizer.decode(with_special[:start]) if start else ""
        suffix = with_special[start + len(plain):]
        if suffix:
            log.warning("the LLM's tokenizer appends %r to every prompt it encodes; chat prompts rendered here "
                        "reach the model with it", tokenizer.decode(suffix))

    @classmethod
    def from_folder(cls, model_dir: Path) -> "Prompts":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        return cls(tokenizer)

    def chat(self, messages: Sequence[dict], tools: Optional[list] = None) -> str:
        """The raw prompt for `messages` ({"role", "content"[, "name"]}) and, for a template that
        takes them, `tools`: the model's chat template with the assistant's turn opened, less the
        prefix the ensemble's tokenizer adds back."""
        text = render_chat(self.tokenizer, messages, tools)
        if self._added_prefix and text.startswith(self._added_prefix):
            text = text[len(self._added_prefix):]
        return text
