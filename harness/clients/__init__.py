"""Clients of a running server.

    kserve   KServe v2 tensors and the inputs of each model's requests (gRPC and HTTP)
    streams  a gRPC bidirectional stream with its responses collected per request
    http     JSON posts, server-sent events of /generate_stream, a client dropping mid-stream
    openai   OpenAI-compatible servers (the project's OpenAI front, peers): the official SDK, raw
             calls, and a light streaming chat client whose records the streaming load summarizes"""
