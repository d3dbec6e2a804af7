"""vLLM's token routes: POST /tokenize and /detokenize, and the render endpoints
/v1/chat/completions/render and /v1/completions/render (which llm-d's precise prefix routing asks
for the token ids of a request), in vLLM's shapes (vllm/entrypoints/serve/tokenize and render).

The ids are the serving path's own: the text a request becomes (the raw prompt, or the chat
template rendered exactly as /v1/chat/completions renders it, tools included) is encoded by the
model's tokenizer step over gRPC (Backend.tokenize: for `generate`, the llm_tokenizer, whose ids
the ensemble feeds the llm), so what /tokenize and render say is what the llm is fed. The special
tokens follow from that: a raw prompt always gets those the tokenizer adds, a chat prompt only
those its template writes; a request asking otherwise (add_special_tokens) is refused where it
would change the ids, naming it. Token strings and /detokenize's text come from the model's
tokenizer in the front (local_tokenizer).
"""
import uuid
from typing import Union

from .api_errors import invalid, unsupported
from .backend import Backend, TextGenerationRequest
from .local_tokenizer import LocalTokenizer
from .protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeTokensRequest, TokenizeChatRequest,
                       TokenizeCompletionRequest)
from .serving_chat import ChatServing
from .serving_completions import CompletionServing

GENERATE, EMBED = "generate", "embed"  # the kinds of served models


class TokenizationServing:
    def __init__(self, backend: Backend, chat: ChatServing, completion: CompletionServing,
                 tokenizers: dict[str, LocalTokenizer]):
        # tokenizers: the front's tokenizer of each kind of served model (GENERATE, EMBED)
        self.backend, self.chat, self.completion, self.tokenizers = backend, chat, completion, tokenizers

    def _tokenizer(self, kind: str, model: str) -> LocalTokenizer:
        tokenizer = self.tokenizers.get(kind)
        if tokenizer is None:
            raise invalid("model", f"model: the front has no tokenizer for '{model}'", code="unsupported_model")
        return tokenizer

    async def tokenize(self, request: Union[TokenizeCompletionRequest, TokenizeChatRequest], model: str,
                       triton_model: str, kind: str) -> dict:
        """vLLM's TokenizeResponse for `model` (the client's name for `triton_model`, of `kind`)."""
        tokenizer = self._tokenizer(kind, model)
        if isinstance(request, TokenizeChatRequest):
            prompt, param = self._chat_prompt(request, model, kind, tokenizer), "messages"
        else:
            if not request.add_special_tokens and tokenizer.adds_special_tokens:
                raise unsupported("add_special_tokens", f"false: model '{model}' is sent every prompt with the "
                                                        "special tokens its tokenizer adds")
            prompt, param = request.prompt, "prompt"
        [ids] = await self.backend.tokenize(triton_model, [prompt], param)
        return {"count": len(ids), "max_model_len": tokenizer.max_length, "tokens": ids,
                "token_strs": tokenizer.token_strings(ids) if request.return_token_strs else None}

    def _chat_prompt(self, request: TokenizeChatRequest, model: str, kind: str, tokenizer: LocalTokenizer) -> str:
        if kind != GENERATE:
            raise invalid("messages", f"messages: model '{model}' has no chat template")
        for param in ("chat_template", "chat_template_kwargs", "mm_processor_kwargs"):
            if getattr(request, param):
                raise unsupported(param, "the model's own chat template renders every conversation, as for "
                                         "/v1/chat/completions")
        if request.continue_final_message:
            raise unsupported("continue_final_message", "a conversation's prompt ends with the template's "
                                                        "generation prompt or with its last message's end")
        if request.add_special_tokens and tokenizer.adds_special_tokens:
            raise unsupported("add_special_tokens", "true: a chat prompt reaches the llm with the special tokens its "
                                                    "template writes and no others")
        prompt, _ = self.chat.prompt(model, request.messages, request.tools, None, None, request.add_generation_prompt)
        return prompt

    def detokenize(self, request: DetokenizeTokensRequest, model: str, kind: str) -> dict:
        tokenizer = self._tokenizer(kind, model)
        size = tokenizer.vocab_size
        for i, token in enumerate(request.tokens):
            if token >= size:
                raise invalid(f"tokens[{i}]", f"tokens[{i}]: {token} is not a token id of model '{model}' (its "
                                              f"vocabulary has {size})")
        return {"prompt": tokenizer.decode(request.tokens)}

    async def render_chat(self, request: ChatCompletionRequest) -> dict:
        """The GenerateRequest the llm would get for a chat completion request: its token ids."""
        generation, _ = self.chat.generation_request(request)
        [ids] = await self.backend.tokenize(generation.model, generation.prompts, "messages")
        return _generate_request("chatcmpl", ids, request, generation)

    async def render_completion(self, request: CompletionRequest) -> list[dict]:
        """One GenerateRequest per prompt of a completion request."""
        generation = self.completion.generation_request(request)
        lists = await self.backend.tokenize(generation.model, generation.prompts, "prompt")
        return [_generate_request("cmpl", ids, request, generation) for ids in lists]


def _generate_request(prefix: str, ids: list[int], request: Union[ChatCompletionRequest, CompletionRequest],
                      generation: TextGenerationRequest) -> dict:
    """vLLM's GenerateRequest (serve/disagg/protocol.py); sampling_params holds what the request sets
    by vLLM's names, with the defaults the front applies (None: the llm decides, as for max_tokens)."""
    stream_options = request.stream_options.model_dump() if request.stream and request.stream_options else None
    return {"request_id": f"{prefix}-{uuid.uuid4().hex}", "token_ids": ids, "features": None,
            "sampling_params": _sampling_params(request, generation), "model": request.model,
            "stream": bool(request.stream), "stream_options": stream_options, "cache_salt": None, "priority": 0,
            "kv_transfer_params": None}


def _sampling_params(request, generation: TextGenerationRequest) -> dict:
    temperature = 1.0 if request.temperature is None else request.temperature
    return {"n": request.n, "temperature": temperature,
            "top_p": 1.0 if request.top_p is None or temperature == 0 else request.top_p,
            "top_k": request.top_k or 0, "seed": request.seed, "stop": list(request.stop or []),
            "presence_penalty": request.presence_penalty or 0.0,
            "frequency_penalty": request.frequency_penalty or 0.0,
            "repetition_penalty": 1.0 if request.repetition_penalty is None else request.repetition_penalty,
            "max_tokens": generation.max_tokens, "min_tokens": request.min_tokens or 0,
            "logprobs": generation.logprobs}

