"""Guides compiled with xgrammar for the bundled SmolLM2 tokenizer (no model): what each guide type
accepts, the compiler's own message for a malformed guide, and the cache."""
import pytest
import torch

from tritonfront.core import model_sources
from tritonfront.engines.base import GuidedDecoding
from tritonfront.engines.guided import GuideCompiler, allocate_bitmask, apply_bitmask
from tritonfront.errors import InvalidInput

VOCAB, EOS = 49152, 2


@pytest.fixture(scope="module")
def guides():
    return GuideCompiler(model_sources.llm_model_dir(), VOCAB, [EOS])


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_sources.llm_model_dir())


def accepts(guides, tokenizer, guided: GuidedDecoding, text: str) -> bool:
    """Whether the guide's matcher takes `text` token by token and may then end."""
    matcher = guides.matcher(guided)
    for token in tokenizer(text, add_special_tokens=False).input_ids:
        if not matcher.accept_token(token):
            return False
    return matcher.accept_token(EOS)


@pytest.mark.parametrize("guided, good, bad", [
    (GuidedDecoding("json"), '{"a": [1, 2]}', '"just a string"'),
    (GuidedDecoding("json"), "[true, null]", "{'a': 1}"),
    (GuidedDecoding("json_schema", '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'),
     '{"n": 42}', '{"n": "42"}'),
    (GuidedDecoding("regex", r"[0-9]{3}-[a-z]+"), "123-abc", "12-abc"),
    (GuidedDecoding("ebnf_grammar", 'root ::= "yes" | "no"'), "no", "maybe"),
])
def test_each_guide_type_accepts_what_it_describes(guides, tokenizer, guided, good, bad):
    assert accepts(guides, tokenizer, guided, good)
    assert not accepts(guides, tokenizer, guided, bad)


@pytest.mark.parametrize("guided, field, message", [
    (GuidedDecoding("json_schema", "{not json"), "guided_decoding_guide", "json_schema does not compile: Failed to parse"),
    (GuidedDecoding("regex", "(a"), "guided_decoding_guide", "regex does not compile"),
    (GuidedDecoding("ebnf_grammar", "root ::= undefined_rule"), "guided_decoding_guide", "undefined_rule"),
    (GuidedDecoding("yaml", "a: 1"), "guided_decoding_guide_type", "must be one of"),
    (GuidedDecoding("regex", ""), "guided_decoding_guide", "is required"),
])
def test_a_malformed_guide_is_invalid_input_with_the_compilers_message(guides, guided, field, message):
    with pytest.raises(InvalidInput) as error:
        guides.compile(guided)
    assert error.value.field == field and message in str(error.value)
    assert "/project/" not in str(error.value) and "[" not in str(error.value).split(":")[0]


def test_compiled_guides_are_cached(guides):
    guided = GuidedDecoding("regex", "cached[0-9]")
    assert guides.compile(guided) is guides.compile(GuidedDecoding("regex", "cached[0-9]"))


def test_the_bitmask_masks_only_the_guided_rows(guides, tokenizer):
    matcher = guides.matcher(GuidedDecoding("regex", "[0-9]+"))
    bitmask = allocate_bitmask(2, VOCAB)
    matcher.fill_next_token_bitmask(bitmask, 1)
    scores = torch.zeros(2, VOCAB)
    apply_bitmask(scores, bitmask, [1], VOCAB)
    assert torch.isfinite(scores[0]).all()
    allowed = torch.isfinite(scores[1]).nonzero().flatten().tolist()
    assert allowed and all(tokenizer.decode([t]).isdigit() for t in allowed)
