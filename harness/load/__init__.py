"""Load on a server, and what became of each request.

    outcomes   the one outcome taxonomy (served, rejected, timed out, invalid ...) and tallies
    schedule   Poisson send times, the open loop that keeps them, the closed loop
    unary      request/response load: sweeps of Poisson rates, closed-loop throughput, floods
    streaming  streamed generation over gRPC streams: TTFT, inter-token latency, tokens
    threads    closed-loop clients on threads, for blocking clients (faults, soak)
"""
