"""Chat prompts rendered by the front (without transformers) reach the model as the ids
transformers' own apply_chat_template(tokenize=True) gives, for the bundled LLM and for a tokenizer
that adds a BOS; a conversation the template refuses is the client's error."""
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from tritonfront.core import model_sources
from tritonfront.openai.api_errors import OpenAIError
from tritonfront.core.chat_template import ChatTemplate
from tritonfront.openai.local_tokenizer import LocalTokenizer
from tritonfront.openai.prompts import Prompts

CONVERSATION = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


@pytest.fixture(scope="module")
def llm():
    folder = model_sources.llm_model_dir()
    return Prompts.from_folder(folder), AutoTokenizer.from_pretrained(folder)


def template_ids(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                         return_dict=True)["input_ids"]


@pytest.mark.parametrize("messages", [CONVERSATION[1:2], CONVERSATION])
def test_the_llms_chat_prompt_encodes_as_its_template(llm, messages):
    prompts, tokenizer = llm
    prompt = prompts.chat(messages)
    assert tokenizer(prompt, add_special_tokens=True)["input_ids"] == template_ids(tokenizer, messages)


def test_the_developer_role_is_the_system_role(llm):
    prompts, _ = llm
    developer = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert prompts.chat(developer) == prompts.chat(system)


def bos_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose post-processor adds <s>, and whose chat template writes it too."""
    words = ["<s>", "</s>", "<unk>", "user:", "assistant:", "hello", "there", "\n"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tokenizer.chat_template = ("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}"
                               "{% if add_generation_prompt %}assistant: {% endif %}")
    return tokenizer


def test_a_bos_written_by_the_template_is_not_added_twice():
    tokenizer = bos_tokenizer()
    prompts = Prompts(LocalTokenizer(Tokenizer.from_str(tokenizer.backend_tokenizer.to_str()), {}, 512),
                      ChatTemplate(tokenizer.chat_template, tokenizer.special_tokens_map))
    messages = [{"role": "user", "content": "hello there"}]
    prompt = prompts.chat(messages)
    assert not prompt.startswith("<s>")
    assert tokenizer(prompt, add_special_tokens=True)["input_ids"] == template_ids(tokenizer, messages)


def test_a_conversation_the_template_refuses_is_a_400_naming_messages():
    prompts = Prompts(LocalTokenizer(Tokenizer.from_str(bos_tokenizer().backend_tokenizer.to_str()), {}, 512),
                      ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('users first') }}{% endif %}",
                                   {}))
    with pytest.raises(OpenAIError) as refused:
        prompts.chat([{"role": "system", "content": "hello"}])
    assert (refused.value.status, refused.value.param) == (400, "messages")
    assert "users first" in refused.value.message
