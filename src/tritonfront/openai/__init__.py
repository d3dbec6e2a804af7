"""tritonfront's OpenAI-compatible API: a process of its own in front of tritonserver (an ASGI app
on uvicorn, started by scripts/serve.sh), a client of Triton over gRPC that never imports Triton's
Python backend.

    config      the front's typed configuration: flags, each with an environment default
    errors      errors in OpenAI's shape; Triton's errors mapped onto them
    schemas     request bodies parsed and checked (pydantic, strict types, unknown fields refused)
    prompts     the LLM's tokenizer: chat template, prompt lengths, tokens for log probs
    translate   an OpenAI request -> the generation ensemble's inputs (the TensorRT-LLM contract)
    triton      the Triton client: one gRPC channel; generation always as a gRPC stream with an
                inactivity deadline, cancelled when its client goes away
    generation  /v1/completions and /v1/chat/completions, whole and streamed
    embeddings  /v1/embeddings: text through the embed ensemble, token ids through encoder + pooler
    sse         server-sent events and the streaming response that stops when its client leaves
    app         the routes; `python -m tritonfront.openai` serves them
"""
