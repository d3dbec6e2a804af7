"""Guided decoding with xgrammar, the library TensorRT-LLM uses: a guide compiles once per
tokenizer into a grammar; each guided request then gets a matcher that, before every step, writes
the tokens the grammar allows next into a bitmask, and that is advanced with each token the request
generates. A malformed guide is the client's error, found when it compiles (Engine.check_params on
Triton's execute thread), so it reaches the client as INVALID_ARG before the request is queued.

Guide types map to xgrammar as TensorRT-LLM maps them: "json" is xgrammar's built-in JSON grammar (an
object or an array), "json_schema", "regex" and "ebnf_grammar" compile the guide text with
xgrammar's defaults.
"""
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Optional, Sequence

from ..errors import InvalidInput
from .base import GuidedDecoding

# Compiled grammars kept for requests that repeat a guide (a client's schema usually repeats).
CACHE_ENTRIES = 256
# xgrammar's C++ errors start with "[hh:mm:ss] /path/file.cc:123: "; the client needs the rest.
_LOCATION = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


def client_message(error: Exception) -> str:
    """A guide compiler's error as a client reads it: its first line, without xgrammar's source location."""
    text = str(error).strip()
    return _LOCATION.sub("", text.splitlines()[0] if text else type(error).__name__)


def check_guide(guides: Optional["GuideCompiler"], guided: Optional[GuidedDecoding]) -> None:
    """What every engine refuses of a guided request: a guide without a tokenizer folder to compile
    it with (`guides` None), or one that does not compile."""
    if guided is None:
        return
    if guides is None:
        raise InvalidInput("guided_decoding_guide_type", "this engine was started without a tokenizer "
                                                         "folder, which guided decoding needs")
    guides.compile(guided)


class GuideCompiler:
    """Compiles guides for one tokenizer, loaded on first use: an engine that never sees a guided
    request never pays for it (about 220 MiB; the first guided request waits for it, about 5 s on a
    busy 2-core machine). Thread-safe: compiles run one at a time."""

    def __init__(self, tokenizer_dir: Path, vocab_size: int, stop_token_ids: Sequence[int]):
        self._tokenizer_dir = tokenizer_dir
        self.vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self._compiler = None
        self._compiled: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def _xgrammar_compiler(self):
        if self._compiler is None:
            import xgrammar
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self._tokenizer_dir)
            info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size,
                                                           stop_token_ids=self._stop_token_ids)
            self._compiler = xgrammar.GrammarCompiler(info)
        return self._compiler

    def compile(self, guided: GuidedDecoding):
        """The xgrammar CompiledGrammar of a guide; InvalidInput naming guided_decoding_guide, with the
        compiler's message, when the guide does not compile."""
        guided.validate()
        with self._lock:
            compiled = self._compiled.get(guided)
            if compiled is not None:
                self._compiled.move_to_end(guided)
                return compiled
            compiler = self._xgrammar_compiler()
            try:
                if guided.guide_type == "json":
                    compiled = compiler.compile_builtin_json_grammar()
                elif guided.guide_type == "json_schema":
                    compiled = compiler.compile_json_schema(guided.guide)
                elif guided.guide_type == "regex":
                    compiled = compiler.compile_regex(guided.guide)
                else:
                    compiled = compiler.compile_grammar(guided.guide)
            except Exception as error:  # xgrammar raises RuntimeError (or ValueError) with the parser's message
                raise InvalidInput("guided_decoding_guide",
                                   f"{guided.guide_type} does not compile: {client_message(error)}") from error
            self._compiled[guided] = compiled
            if len(self._compiled) > CACHE_ENTRIES:
                self._compiled.popitem(last=False)
            return compiled

    def matcher(self, guided: GuidedDecoding):
        import xgrammar

        return xgrammar.GrammarMatcher(self.compile(guided))


def allocate_bitmask(rows: int, vocab_size: int):
    import xgrammar

    return xgrammar.allocate_token_bitmask(rows, vocab_size)


def apply_bitmask(scores, bitmask, rows: list[int], vocab_size: Optional[int] = None) -> None:
    """Sets to -inf, in place, every token a row's grammar does not allow next (rows index both the
    scores and the bitmask)."""
    import xgrammar

    xgrammar.apply_token_bitmask_inplace(scores, bitmask.to(scores.device, non_blocking=True),
                                         vocab_size=vocab_size, indices=rows)
