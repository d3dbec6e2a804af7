"""The harness that tests/ and perf/ share: it starts servers, sends requests, generates load,
accounts for CPU and memory, and renders reports. It imports the product (tritonfront) and
never tests/ or perf/; tests and benchmarks import it and never each other.

    paths          where the repository, its model repositories and results are
    server         tritonserver through scripts/serve.sh on free loopback ports (with its OpenAI front
                   when asked)
    deploy         deployments to serve: scripts/configure.py output, renamed copies, config variants;
                   the engine the tests' server runs
    triton_metrics Triton's statistics API and Prometheus metrics text
    accounting     CPU and memory: the machine, other work, process trees, threads
    observe        what one load step did to the server (counters, CPU, other work)
    ranks          the llm ranks' load table in /dev/shm
    clients/       KServe tensors and requests, gRPC stream collector, HTTP generate and SSE,
                   OpenAI-compatible servers (the SDK, raw calls, a light streaming chat client)
    load/          outcomes (one taxonomy), schedules, unary and streaming load, client threads
    corpora        texts and prompts
    references     sentence-transformers; each llm engine's own run alone (transformers, llama-cpp-python)
    chunks         detokenizer chunk streams, as an engine sends them
    faults         a stub SIGKILLed under load and the recovery
    stats          percentiles, medians, ratios, growth over time
    analyzer       perf_analyzer runs and what its outputs say
    ceiling        in-process ceiling vs through-Triton rounds
    report         result files: markdown tables, the machine, the command, plots
    fresh_python   code run in a new interpreter (what an import brings in)
"""
