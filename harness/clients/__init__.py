"""Clients of a running server.

    kserve   KServe v2 tensors and the inputs of each model's requests (gRPC and HTTP)
    streams  a gRPC bidirectional stream with its responses collected per request
    http     JSON posts, server-sent events of /generate_stream, a client dropping mid-stream

An OpenAI-compatible client (the project's OpenAI front, and peer servers that speak it) goes in
clients/openai.py beside these, and the load module drives it through the same outcomes."""
