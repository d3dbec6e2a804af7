"""tritonfront's OpenAI-compatible API: a process of its own in front of tritonserver (an ASGI app
on uvicorn, started by scripts/serve.sh), a client of Triton over gRPC that never imports Triton's
Python backend.

    config               the front's typed configuration: flags, each with an environment default
    api_errors           errors in OpenAI's shape
    protocol             the wire schemas: request bodies parsed and checked (pydantic, strict types, unknown
                         fields refused)
    prompts              the LLM's chat prompts: its chat template rendered (chat_template), what the
                         ensemble's tokenizer adds removed
    chat_template        chat templates rendered as transformers renders them, without transformers
    local_tokenizer      a model's tokenizer.json in the front (tokenizers only): decoding, token strings,
                         offsets, the special tokens a prompt gets
    backend              the Backend interface the endpoints are served by, and what it takes and gives
    answers              what a request's text deltas add up to: choices and usage
    serving_chat         /v1/chat/completions          \\
    serving_completions  /v1/completions                } openai.types objects from the backend's answers
    serving_embeddings   /v1/embeddings                /
    serving_models       /v1/models and /health       /
    serving_tokenization vLLM's /tokenize, /detokenize and render endpoints: the ids the llm is fed
    serving_scores       vLLM's /v1/score and /v1/rerank: cosine similarity of the embedding model's vectors
    serving_tei          text-embeddings-inference's /embed, /similarity, /tokenize, /decode, /rerank
    tei_protocol         TEI's wire schemas and errors
    tools                tool calling: tools and tool_choice checked, the prompt they add, the guide of a
                         forced call, the model's text turned into tool_calls (whole and streamed)
    logprobs             log probs and top alternatives in OpenAI's shapes from the per-token outputs
    metrics              the front's Prometheus metrics (vLLM's names) and the responses counted
    streaming            SSE through Starlette's StreamingResponse; work cancelled when its client leaves
    keepalive            SSE comments at the start and through silences, for proxies' idle timeouts
    router               the routes and the Starlette app; `python -m tritonfront.openai` serves them
    triton_backend       the Backend served by Triton: the generation and embedding ensembles, and their
                         tokenizer steps
    triton_client        the Triton client: one gRPC channel; generation always as a gRPC stream with an
                         inactivity deadline, cancelled when its client goes away
    triton_inputs        a generation request -> the generation ensemble's inputs (the TensorRT-LLM contract)
    triton_errors        Triton's errors mapped onto OpenAI's
"""
