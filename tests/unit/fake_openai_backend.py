"""A Backend (tritonfront.openai.backend) for unit tests of the OpenAI front's routes and serving
modules: it answers from scripts, no server; and a stand-in for the LLM tokenizer's Prompts."""
import asyncio

import numpy as np

from tritonfront.openai.backend import Embeddings, TextDelta, TextGenerationRequest

HANG = object()  # in a script: the backend waits for ever


class FakeBackend:
    """The Backend protocol from scripts: per prompt, the deltas (or an exception, or HANG) to give."""

    def __init__(self, scripts=None, ready=True, refuse=None, vectors=None):
        # vectors: text -> its embedding (else [0.5, -0.25, its index])
        self.scripts, self.is_ready, self.refuse, self.vectors = scripts or {}, ready, refuse, vectors or {}
        self.requests: list[TextGenerationRequest] = []
        self.embedded, self.tokenized = [], []
        self.closed = asyncio.Event()

    async def ready(self):
        return self.is_ready

    async def model_ready(self, model):
        return model != "embed" or self.is_ready

    async def generate(self, request):
        self.requests.append(request)
        if self.refuse:
            raise self.refuse
        return self._deltas(request)

    async def _deltas(self, request):
        try:
            for prompt in request.prompts:
                for item in self.scripts[prompt]:
                    if item is HANG:
                        await asyncio.sleep(3600)
                    if isinstance(item, Exception):
                        raise item
                    yield item
        finally:
            self.closed.set()

    async def embed(self, model, inputs, dimensions, truncate=None, param="input"):
        self.embedded.append((model, list(inputs), truncate, param))
        if self.refuse:
            raise self.refuse
        vectors = np.array([self.vectors.get(item, [0.5, -0.25, float(i)]) if isinstance(item, str)
                            else [0.5, -0.25, float(i)] for i, item in enumerate(inputs)], dtype=np.float32)
        return Embeddings(vectors[:, :dimensions] if dimensions else vectors, prompt_tokens=7 * len(inputs))

    async def tokenize(self, model, texts, param):
        """Each text's ids: its characters' code points (the model's tokenizer stand-in)."""
        self.tokenized.append((model, list(texts), param))
        if self.refuse:
            raise self.refuse
        return [[ord(c) for c in text] for text in texts]


class Prompts:
    """The LLM tokenizer's stand-in: a chat prompt is its messages joined."""
    has_chat_template = True
    template_takes_tools = False

    def chat(self, messages, tools=None, add_generation_prompt=True):
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + ("|assistant:" if add_generation_prompt
                                                                             else "")


def delta(text, finish_reason=None, completion_tokens=1, tokens=None) -> TextDelta:
    return TextDelta(0, 0, text, finish_reason, prompt_tokens=4, completion_tokens=completion_tokens, tokens=tokens)
