"""JSON schemas, written here from the documented fields, for the configuration files deploy/kubernetes
hands to other programs, which publish no schema of their own (the custom resources are checked
against their published CRDs instead: k8s_crds). Each object lists its documented fields and
rejects any other (a misspelt field fails); the fields the manifests use also get their documented
types, enums and limits.

Sources (read, not copied):
- EndpointPickerConfig llm-d.ai/v1alpha1: llm-d-router v0.10.0, apix/config/v1alpha1/
  endpointpickerconfig_types.go and the parameter structs of the plugins used
  (datalayer/source/metrics, datalayer/extractor/metrics, scheduling/scorer/prefix; the other
  scorers, the picker and the openai and passthrough parsers take none);
- prometheus-adapter Helm values: the chart's values.yaml (prometheus, rules) and the adapter's
  rule configuration (seriesQuery, resources, name, metricsQuery).
"""


def closed(properties: dict, required: tuple = (), **extra) -> dict:
    """An object with exactly these documented fields."""
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False,
            **extra}


ANY_OBJECT = {"type": "object"}
STRING = {"type": "string"}
PORT_NUMBER = {"type": "integer", "minimum": 1, "maximum": 65535}
PROMETHEUS_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                                    r"(([0-9]+)s)?(([0-9]+)ms)?)$"}


# --- the endpoint picker's configuration (llm-d-router v0.10.0) -----------------------------------

REFERENCE = closed({"pluginRef": {"type": "string", "minLength": 1}}, ("pluginRef",))
EPP_DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"}
ENDPOINT_PICKER_CONFIG = closed({
    "apiVersion": {"enum": ["llm-d.ai/v1alpha1"]},  # inference.networking.x-k8s.io/v1alpha1 is deprecated
    "kind": {"const": "EndpointPickerConfig"},
    "featureGates": {"type": "array", "items": STRING},
    "plugins": {"type": "array", "minItems": 1, "items": closed(
        {"name": STRING, "type": {"type": "string", "minLength": 1}, "parameters": ANY_OBJECT}, ("type",))},
    "schedulingProfiles": {"type": "array", "items": closed({
        "name": {"type": "string", "minLength": 1},
        "plugins": {"type": "array", "items": closed({"pluginRef": STRING, "weight": {"type": "number"}},
                                                    ("pluginRef",))}}, ("name", "plugins"))},
    "dataLayer": closed({
        "injectDefaults": {"type": "boolean"},
        "sources": {"type": "array", "items": closed({"pluginRef": STRING,
                                                     "extractors": {"type": "array", "items": REFERENCE}},
                                                    ("pluginRef", "extractors"))},
        "discovery": REFERENCE, "peerDiscovery": REFERENCE, "crossReplicaSyncerPluginRef": STRING,
        "crossReplicaSyncInterval": EPP_DURATION}),
    "flowControl": ANY_OBJECT,
    "requestHandler": closed({"parsers": {"type": "array", "items": REFERENCE}}),
    "saturationDetector": REFERENCE,  # deprecated: flowControl.saturationDetector
    "parser": REFERENCE,  # deprecated: requestHandler.parsers
}, ("apiVersion", "kind", "plugins", "schedulingProfiles"))

ENGINE_CONFIG = closed({
    "name": {"type": "string", "minLength": 1}, "queuedRequestsSpec": STRING, "runningRequestsSpec": STRING,
    "kvUsageSpec": STRING, "loraSpec": STRING, "cacheInfoSpec": STRING, "cacheBlockSizeLabelName": STRING,
    "cacheNumBlocksLabelName": STRING, "cacheBlockSizeSpec": STRING, "cacheNumBlocksSpec": STRING,
    "customMetrics": {"type": "array", "items": closed({"attributeKey": STRING, "metricSpec": STRING},
                                                       ("attributeKey", "metricSpec"))},
}, ("name",))
# Plugin type -> the schema of its parameters; a type not listed here is not one this deployment
# knows the parameters of.
PLUGIN_PARAMETERS = {
    "metrics-data-source": closed({
        "scheme": {"enum": ["http", "https"]}, "path": {"type": "string", "pattern": "^/"}, "port": PORT_NUMBER,
        "insecureSkipVerify": {"type": "boolean"}, "caCertPath": STRING, "clientCertPath": STRING,
        "clientKeyPath": STRING, "interval": EPP_DURATION}),
    "core-metrics-extractor": closed({"engineLabelKey": STRING, "defaultEngine": STRING,
                                      "engineConfigs": {"type": "array", "items": ENGINE_CONFIG}}),
    "passthrough-parser": closed({}),
    "openai-parser": closed({}),
    "prefix-cache-scorer": closed({"prefixMatchInfoProducerName": STRING,
                                   "matchLengthWeight": {"type": "number", "minimum": 0, "maximum": 1},
                                   "matchLengthScaleTokens": {"type": "integer", "minimum": 0}}),
    "queue-scorer": closed({}),
    "kv-cache-utilization-scorer": closed({}),
    "running-requests-size-scorer": closed({}),
    "max-score-picker": closed({}),
}
# --- prometheus-adapter's Helm values ------------------------------------------------------------

ADAPTER_RULE = closed({
    "seriesQuery": STRING, "seriesFilters": {"type": "array"},
    "resources": closed({"overrides": {"type": "object", "additionalProperties": closed(
        {"resource": STRING, "group": STRING}, ("resource",))}, "template": STRING}),
    "name": closed({"matches": STRING, "as": STRING}, ("matches",)),
    "metricsQuery": STRING,
}, ("seriesQuery", "resources", "name", "metricsQuery"))
PROMETHEUS_ADAPTER_VALUES = {
    "type": "object",  # the chart has many more values; these are the ones written here
    "properties": {
        "prometheus": closed({"url": {"type": "string", "pattern": "^https?://"}, "port": PORT_NUMBER, "path": STRING}),
        "metricsRelistInterval": PROMETHEUS_DURATION,
        "rules": closed({"default": {"type": "boolean"}, "custom": {"type": "array", "items": ADAPTER_RULE},
                         "existing": {"type": ["string", "null"]}, "external": {"type": "array"},
                         "resource": ANY_OBJECT}),
    },
    "required": ["prometheus", "rules"],
}
