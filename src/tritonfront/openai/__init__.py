"""tritonfront's OpenAI-compatible API: a process of its own in front of tritonserver (an ASGI app
on uvicorn, started by scripts/serve.sh), a client of Triton over gRPC that never imports Triton's
Python backend.

    config               the front's typed configuration: flags, each with an environment default
    api_errors           errors in OpenAI's shape
    protocol             the wire schemas: request bodies parsed and checked (pydantic, strict types, unknown
                         fields refused)
    prompts              the LLM's tokenizer: chat template, prompt lengths, tokens for log probs
    backend              the Backend interface the endpoints are served by, and what it takes and gives
    answers              what a request's text deltas add up to: choices and usage
    serving_chat         /v1/chat/completions          \\
    serving_completions  /v1/completions                } openai.types objects from the backend's answers
    serving_embeddings   /v1/embeddings                /
    serving_models       /v1/models and /health       /
    tools                tool calling: tools and tool_choice checked, the prompt they add, the guide of a
                         forced call, the model's text turned into tool_calls (whole and streamed)
    logprobs             log probs and top alternatives in OpenAI's shapes from the per-token outputs
    metrics              the front's Prometheus metrics (vLLM's names) and the responses counted
    streaming            SSE through Starlette's StreamingResponse; work cancelled when its client leaves
    keepalive            SSE comments at the start and through silences, for proxies' idle timeouts
    router               the routes and the Starlette app; `python -m tritonfront.openai` serves them
    triton_backend       the Backend served by Triton: the generation and embedding ensembles
    triton_client        the Triton client: one gRPC channel; generation always as a gRPC stream with an
                         inactivity deadline, cancelled when its client goes away
    triton_inputs        a generation request -> the generation ensemble's inputs (the TensorRT-LLM contract)
    triton_errors        Triton's errors mapped onto OpenAI's
"""
