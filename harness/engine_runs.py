"""Requests run to their end on an engine in this process, for the engines' unit tests."""
import time

from tritonfront.engines import EngineOutput


def run(engine, requests: dict, timeout: float = 180) -> dict:
    """request id -> (prompt ids, params); returns request id -> its outputs joined into one."""
    results = {rid: EngineOutput(rid) for rid in requests}
    for rid, (ids, params) in requests.items():
        engine.add(rid, ids, params)
    done, deadline = set(), time.monotonic() + timeout
    while len(done) < len(requests):
        assert time.monotonic() < deadline, f"unfinished: {set(requests) - done}"
        for output in engine.outputs(0.05):
            assert output.error is None, output.error
            joined = results[output.request_id]
            joined.token_ids += output.token_ids
            joined.log_probs += output.log_probs
            joined.top_log_probs += output.top_log_probs
            done |= {output.request_id} if output.finished else set()
    return results


def generated(engine, requests: dict) -> dict:
    """request id -> (prompt ids, params); returns request id -> generated ids."""
    return {rid: output.token_ids for rid, output in run(engine, requests).items()}
