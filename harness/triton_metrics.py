"""What a running Triton says about itself: the statistics API (cumulative per-model counters) and
the Prometheus metrics text (Triton's nv_* metrics and tritonfront's own)."""
import re
import time
from typing import Optional

import numpy as np

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})? (\S+)$", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(metrics: str, name: str) -> list[tuple[dict, float]]:
    """Every sample of metric `name`: (labels, value)."""
    return [(dict(_LABEL.findall(labels or "")), float(value))
            for metric, labels, value in _SAMPLE.findall(metrics) if metric == name]


def matching(metrics: str, name: str, **labels: str) -> list[float]:
    return [value for got, value in samples(metrics, name) if all(got.get(k) == v for k, v in labels.items())]


def metric_value(metrics: str, name: str, **labels: str) -> float:
    """The one sample of `name` with these labels (others may exist beside them)."""
    values = matching(metrics, name, **labels)
    if len(values) != 1:
        raise LookupError(f"{len(values)} samples of {name} with {labels} in the metrics, expected 1")
    return values[0]


def metric_sum(metrics: str, name: str, **labels: str) -> Optional[float]:
    """The sum of the samples of `name` with these labels; None when there is none."""
    values = matching(metrics, name, **labels)
    return sum(values) if values else None


def rank_values(metrics: str, name: str) -> dict[str, float]:
    """"model/rank" -> value of a per-rank tritonfront metric, for every model."""
    return {f"{labels['model']}/{labels['rank']}": value for labels, value in samples(metrics, name)
            if "model" in labels and "rank" in labels}


LLM_GAUGES = ("active_sequences", "outstanding_tokens", "waiting_requests", "kv_cache_blocks",
              "cancelled_requests_total")


def llm_gauges(metrics: str, model: str = "llm") -> dict[str, Optional[float]]:
    """tritonfront's llm metrics summed over the model's ranks (None: not exported), and Triton's
    pending requests of all models ("pending_requests")."""
    out = {name: metric_sum(metrics, f"tritonfront_llm_{name}", model=model) for name in LLM_GAUGES}
    out["pending_requests"] = metric_sum(metrics, "nv_inference_pending_request_count")
    return out


def histogram(metrics: str, name: str, **labels: str) -> dict:
    """A Prometheus histogram: upper bounds, cumulative counts, sum and count."""
    buckets = sorted(((float(got["le"]), value) for got, value in samples(metrics, f"{name}_bucket")
                      if all(got.get(k) == v for k, v in labels.items())), key=lambda b: b[0])
    total, count = matching(metrics, f"{name}_sum", **labels), matching(metrics, f"{name}_count", **labels)
    if not buckets or len(total) != 1 or len(count) != 1:
        raise LookupError(f"no histogram {name} with {labels} in the metrics")
    return {"le": np.array([b for b, _ in buckets]), "cumulative": np.array([c for _, c in buckets]),
            "sum": total[0], "count": count[0]}


def histogram_delta(before: dict, after: dict) -> dict:
    return {"le": after["le"], "cumulative": after["cumulative"] - before["cumulative"],
            "sum": after["sum"] - before["sum"], "count": after["count"] - before["count"]}


def histogram_quantile(h: dict, q: float) -> float:
    """As Prometheus' histogram_quantile: linear within the bucket holding the q-th observation;
    beyond the last finite bound, that bound."""
    if h["count"] <= 0:
        return float("nan")
    rank = q * h["count"]
    i = int(np.searchsorted(h["cumulative"], rank))
    if i >= len(h["le"]) or np.isinf(h["le"][i]):
        return float(h["le"][len(h["le"]) - 2])
    lower = h["le"][i - 1] if i > 0 else 0.0
    below = h["cumulative"][i - 1] if i > 0 else 0.0
    inside = h["cumulative"][i] - below
    return float(lower + (h["le"][i] - lower) * ((rank - below) / inside if inside else 1.0))


def model_statistics(grpc_url: str, models: list[str], attempts: int = 5) -> dict[str, dict]:
    """Triton's cumulative per-model counters, to subtract around a load step: requests and the
    time they spent queued; executions (batches), the inferences in them and their compute
    time. Retried: right after an overload a starved server can miss a connection deadline, and
    the counters being cumulative, reading them a little later loses nothing."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    for attempt in range(attempts):
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            return {model: counters(client.get_inference_statistics(model, as_json=True, client_timeout=60))
                    for model in models}
        except InferenceServerException:
            if attempt == attempts - 1:
                raise
            time.sleep(5)
        finally:
            client.close()


def counters(statistics: dict) -> dict:
    """The counters of one model's statistics (the API's JSON)."""
    stats = statistics["model_stats"][0]
    inference = stats["inference_stats"]
    batches = stats.get("batch_stats", [])
    return {
        "requests": int(inference.get("success", {}).get("count", 0)),
        "queue_ns": int(inference.get("queue", {}).get("ns", 0)),
        "executions": sum(int(b["compute_infer"].get("count", 0)) for b in batches),
        "batched_inferences": sum(int(b["batch_size"]) * int(b["compute_infer"].get("count", 0)) for b in batches),
        "compute_ns": sum(int(b[k].get("ns", 0)) for b in batches
                          for k in ("compute_input", "compute_infer", "compute_output")),
    }


def statistics_delta(before: dict, after: dict) -> dict[str, dict]:
    """Per model over a step: requests, executions, mean batch (inferences per execution), mean
    queue ms per request, mean compute ms per execution."""
    out = {}
    for model, end in after.items():
        d = {key: end[key] - before[model][key] for key in end}
        executions, requests = max(d["executions"], 1), max(d["requests"], 1)
        out[model] = {
            "requests": d["requests"], "executions": d["executions"],
            "mean_batch": d["batched_inferences"] / executions,
            "queue_ms_per_request": d["queue_ns"] / requests / 1e6,
            "compute_ms_per_execution": d["compute_ns"] / executions / 1e6,
        }
    return out
