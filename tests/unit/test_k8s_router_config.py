"""The endpoint picker's configuration (deploy/kubernetes/base/endpoint-picker-config.yaml) against
llm-d-router's documented fields (k8s_schemas), and against what tritonfront exports: the metric
specs of the picker's built-in engine type the replicas are labelled with (llm-d-router v0.10.0,
harness.picker.BUILT_IN_ENGINES) name series the llm model exports (tritonfront.core.rank_load.ROUTER_GAUGES),
with the values of tritonfront's own model gauges; they parse as the picker parses them and read the
right values out of a metrics text; its references resolve; OpenAI bodies are parsed; the replicas'
engine label and metrics port are the ones it expects."""
import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

import k8s_schemas
from harness.picker import (BUILT_IN_ENGINES, MAPPING_FIELDS, ReplicaView, engine_mapping, parse_spec, pick,
                            picker_config, plugin_parameters, read, view)
from tritonfront.core.rank_load import MODEL_GAUGES, ROUTER_GAUGES, ModelLoad

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT = ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml"


def validate(config: dict) -> None:
    jsonschema.validate(config, k8s_schemas.ENDPOINT_PICKER_CONFIG)
    names = [plugin.get("name", plugin["type"]) for plugin in config["plugins"]]
    assert len(names) == len(set(names)), names
    for plugin in config["plugins"]:
        assert plugin["type"] in k8s_schemas.PLUGIN_PARAMETERS, f"unknown plugin type {plugin['type']}"
        jsonschema.validate(plugin.get("parameters", {}), k8s_schemas.PLUGIN_PARAMETERS[plugin["type"]])
    references = [entry["pluginRef"] for profile in config["schedulingProfiles"] for entry in profile["plugins"]]
    references += [source["pluginRef"] for source in config.get("dataLayer", {}).get("sources", [])]
    references += [extractor["pluginRef"] for source in config.get("dataLayer", {}).get("sources", [])
                   for extractor in source["extractors"]]
    references += [parser["pluginRef"] for parser in config.get("requestHandler", {}).get("parsers", [])]
    assert set(references) <= set(names), set(references) - set(names)
    for spec in engine_mapping(config).values():
        parse_spec(spec)


def test_the_config_has_only_documented_fields_and_known_plugins():
    validate(picker_config())


@pytest.mark.parametrize("break_it", [
    lambda c: c.update(schedulingProfile=c.pop("schedulingProfiles")),
    lambda c: c["plugins"][2]["parameters"].update(prot=8002),
    lambda c: c["plugins"].append({"type": "queue-scorrer"}),
    lambda c: c["schedulingProfiles"][0]["plugins"].append({"pluginRef": "missing"}),
    lambda c: c["plugins"][3]["parameters"].update(engineConfigs=[{"name": "x", "queuedRequestSpec": "x"}]),
    lambda c: c["plugins"][3]["parameters"].update(engineConfigs=[{
        "name": "x", "queuedRequestsSpec": "a", "runningRequestsSpec": "b", "kvUsageSpec": "not a spec{"}],
        defaultEngine="x"),
    lambda c: c["plugins"][0].update(type="openai-parsr"),
])
def test_a_broken_config_fails(break_it):
    config = copy.deepcopy(picker_config())
    break_it(config)
    with pytest.raises((jsonschema.ValidationError, AssertionError, ValueError)):
        validate(config)


def test_the_engine_mapping_reads_the_router_gauges_of_the_served_llm():
    mapping = engine_mapping(picker_config())
    extractor = plugin_parameters(picker_config(), "core-metrics-extractor")
    assert "engineConfigs" not in extractor  # the picker's own definition of the engine type, unmodified
    assert mapping == {key: BUILT_IN_ENGINES[extractor["defaultEngine"]][field] for key, field in MAPPING_FIELDS.items()}
    fields = {"waiting": "waiting_requests", "running": "running_requests", "kv_cache": "kv_cache_utilization"}
    for key, spec in mapping.items():
        exported, labels = ROUTER_GAUGES[fields[key]]
        assert parse_spec(spec) == (exported.name, labels)


def test_the_router_gauges_carry_the_values_of_tritonfronts_own():
    """What the picker reads (ROUTER_GAUGES) and README's names (MODEL_GAUGES) are set from one
    ModelLoad field each (tests/unit/test_load.py checks the values set); the KV cache's size has
    only the router's names."""
    assert set(MODEL_GAUGES) <= set(ROUTER_GAUGES)
    assert set(ROUTER_GAUGES) <= set(ModelLoad.__dataclass_fields__)


def test_every_series_the_declared_engine_type_reads_is_exported():
    """The replicas' engine type reads five series (queue, running, KV cache fraction, and the
    cache's block size and block count for its prefix scorers): the llm exports each of them."""
    extractor = plugin_parameters(picker_config(), "core-metrics-extractor")
    exported = [(spec.name, labels) for spec, labels in ROUTER_GAUGES.values()]
    engine = BUILT_IN_ENGINES[extractor["defaultEngine"]]
    assert {"cacheBlockSizeSpec", "cacheNumBlocksSpec"} <= set(engine)
    for field, spec in engine.items():
        assert parse_spec(spec) in exported, field


def test_openai_bodies_are_parsed_and_the_rest_passes_through():
    config = picker_config()
    types = {plugin.get("name", plugin["type"]): plugin["type"] for plugin in config["plugins"]}
    parsers = [types[entry["pluginRef"]] for entry in config["requestHandler"]["parsers"]]
    # First match by path wins; the passthrough parser claims no path, so it must come last.
    assert parsers == ["openai-parser", "passthrough-parser"]
    (profile,) = config["schedulingProfiles"]
    assert "prefix-cache-scorer" in {types[entry["pluginRef"]] for entry in profile["plugins"]}


def test_the_replicas_carry_the_engine_label_and_serve_metrics_where_the_picker_scrapes():
    config = picker_config()
    extractor = plugin_parameters(config, "core-metrics-extractor")
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[extractor.get("engineLabelKey", "llm-d.ai/engine-type")] == extractor["defaultEngine"]
    ports = {p["name"]: p["containerPort"] for c in deployment["spec"]["template"]["spec"]["containers"]
             for p in c["ports"]}
    source = plugin_parameters(config, "metrics-data-source")
    assert source["port"] == ports["metrics"] and source["path"] == "/metrics"


METRICS = """# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="llm",request_type="waiting"} 7
nv_trt_llm_request_metrics{model="llm",request_type="scheduled"} 3
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="llm"} 0.25
tritonfront_num_requests_waiting{model="llm"} 7
tritonfront_llm_waiting_requests{model="llm",rank="0"} 1
"""


def test_what_the_picker_reads_and_whom_it_prefers():
    mapping = engine_mapping(picker_config())
    assert read(METRICS, mapping["waiting"]) == 7  # the waiting series, not the scheduled one
    assert view(METRICS, mapping) == ReplicaView(waiting=7, running=3, kv_cache=0.25)
    with pytest.raises(LookupError):
        view("tritonfront_num_requests_waiting{model=\"llm\"} 1\n", mapping)
    busy, idle = ReplicaView(6, 4, 0.5), ReplicaView(0, 3, 0.1)
    assert pick({"a": busy, "b": idle}, picker_config()) == "b"
    assert pick({"a": idle, "b": busy}, picker_config()) == "a"
