"""What the endpoint picker of deploy/kubernetes reads off a replica, and which replica it prefers.

The picker's configuration maps three standard values to metric specs (PromQL instant-vector
selectors, `name{label="value"}`): waiting requests, running requests, KV cache utilization.
llm-d-router (v0.10.0, the image the manifests pin) reads each from a replica's metrics text as the
first series of that name whose labels include the spec's, waiting and running as integers, and
scores replicas with the configured scorers, weighted: queue-scorer and
running-requests-size-scorer rank a replica between the pool's lowest (1) and highest (0) count,
kv-cache-utilization-scorer gives 1 - utilization (prefix-cache-scorer needs prompts, and scores
every replica alike for prompts none has seen); the highest sum takes the request. Here the same
rules are applied to real replicas' metrics, so a test sees what the picker would."""
import re
from dataclasses import dataclass
from typing import Optional

import yaml

from .paths import ROOT
from .triton_metrics import samples

CONFIG_MAP = ROOT / "deploy" / "kubernetes" / "base" / "endpoint-picker-config.yaml"
SPEC = re.compile(r"^\s*(\S+?)\s*(?:\{([^}]*)\})?\s*$")
LABEL = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"?([^",]*)"?\s*$')
MAPPING_FIELDS = {"waiting": "queuedRequestsSpec", "running": "runningRequestsSpec", "kv_cache": "kvUsageSpec"}
# The picker's built-in engine types that deploy/kubernetes relies on, as llm-d-router v0.10.0
# defines them (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go,
# defaultEngineConfigs; read from the source at tag v0.10.0, commit 0b43c187). An engineConfigs
# entry of the same name replaces one.
BUILT_IN_ENGINES = {
    "triton-tensorrt-llm": {
        "queuedRequestsSpec": "nv_trt_llm_request_metrics{request_type=waiting}",
        "runningRequestsSpec": "nv_trt_llm_request_metrics{request_type=scheduled}",
        "kvUsageSpec": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
        # Read too, by the prefix scorers' index when it auto-tunes (the llm exports both:
        # tritonfront.core.rank_load.ROUTER_GAUGES).
        "cacheBlockSizeSpec": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
        "cacheNumBlocksSpec": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
    },
    "vllm": {
        "queuedRequestsSpec": "vllm:num_requests_waiting",
        "runningRequestsSpec": "vllm:num_requests_running",
        "kvUsageSpec": "vllm:kv_cache_usage_perc",
    },
}
DEFAULT_ENGINE = "vllm"  # the extractor's defaultEngine when the config names none


def picker_config() -> dict:
    """The EndpointPickerConfig the manifests hand to the picker."""
    (config_file,) = yaml.safe_load(CONFIG_MAP.read_text())["data"].values()
    return yaml.safe_load(config_file)


def plugin_parameters(config: dict, plugin_type: str) -> dict:
    (plugin,) = [p for p in config["plugins"] if p["type"] == plugin_type]
    return plugin.get("parameters", {})


def engine_mapping(config: dict) -> dict[str, str]:
    """waiting / running / kv_cache -> metric spec of the default engine: the config's own
    engineConfigs entry of that name, else the built-in one."""
    extractor = plugin_parameters(config, "core-metrics-extractor")
    name = extractor.get("defaultEngine", DEFAULT_ENGINE)
    configured = [e for e in extractor.get("engineConfigs", []) if e["name"] == name]
    engine = configured[0] if configured else BUILT_IN_ENGINES[name]
    return {key: engine[field] for key, field in MAPPING_FIELDS.items()}


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """(metric name, labels) of a spec; ValueError when it is not one."""
    match = SPEC.match(spec)
    if not match or not re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]*", match.group(1)):
        raise ValueError(f"not a metric spec: {spec!r}")
    labels = {}
    for pair in filter(None, (match.group(2) or "").split(",")):
        label = LABEL.match(pair)
        if not label:
            raise ValueError(f"invalid label pair {pair!r} in {spec!r}")
        labels[label.group(1)] = label.group(2)
    return match.group(1), labels


def read(metrics: str, spec: str) -> Optional[float]:
    """The value a spec selects in a metrics text; None when no series matches."""
    name, labels = parse_spec(spec)
    for got, value in samples(metrics, name):
        if labels.items() <= got.items():
            return value
    return None


@dataclass(frozen=True)
class ReplicaView:
    waiting: int
    running: int
    kv_cache: float


def view(metrics: str, mapping: dict[str, str]) -> ReplicaView:
    values = {key: read(metrics, spec) for key, spec in mapping.items()}
    missing = [mapping[key] for key, value in values.items() if value is None]
    if missing:
        raise LookupError(f"no series for {missing} in the replica's metrics")
    return ReplicaView(int(values["waiting"]), int(values["running"]), values["kv_cache"])


def _rank_low(counts: dict[str, int]) -> dict[str, float]:
    low, high = min(counts.values()), max(counts.values())
    return {replica: 1.0 if high == low else (high - count) / (high - low) for replica, count in counts.items()}


def scores(views: dict[str, ReplicaView], config: dict) -> dict[str, float]:
    """Each replica's weighted score under the config's default profile."""
    (profile,) = [p for p in config["schedulingProfiles"] if p["name"] == "default"]
    types = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    by_scorer = {
        "queue-scorer": _rank_low({r: v.waiting for r, v in views.items()}),
        "running-requests-size-scorer": _rank_low({r: v.running for r, v in views.items()}),
        "kv-cache-utilization-scorer": {r: 1 - v.kv_cache for r, v in views.items()},
    }
    total = {replica: 0.0 for replica in views}
    for entry in profile["plugins"]:
        kind = types[entry["pluginRef"]]
        if kind in by_scorer:
            for replica, score in by_scorer[kind].items():
                total[replica] += entry.get("weight", 1.0) * score
    return total


def pick(views: dict[str, ReplicaView], config: dict) -> str:
    ranked = scores(views, config)
    return max(ranked, key=ranked.get)
