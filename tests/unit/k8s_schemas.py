"""JSON schemas, written here from the documented fields, for what kubernetes-validate has no schema
of: the custom resources deploy/kubernetes uses and the configuration files it hands to other
programs. Each object lists its documented fields and rejects any other (a misspelt field fails);
the fields the manifests use also get their documented types, enums and limits.

Sources (read, not copied):
- InferencePool inference.networking.k8s.io/v1: Gateway API Inference Extension,
  config/crd/bases/inference.networking.k8s.io_inferencepools.yaml;
- HTTPRoute gateway.networking.k8s.io/v1: Gateway API reference (HTTPRoute, HTTPRouteRule,
  HTTPBackendRef, ParentReference, HTTPRouteTimeouts);
- PodMonitor monitoring.coreos.com/v1: Prometheus Operator API reference (PodMonitorSpec,
  PodMetricsEndpoint);
- EndpointPickerConfig llm-d.ai/v1alpha1: llm-d-router v0.10.0, apix/config/v1alpha1/
  endpointpickerconfig_types.go and the parameter structs of the plugins used
  (datalayer/source/metrics, datalayer/extractor/metrics; the scorers, picker and passthrough
  parser take none);
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
LABEL_VALUE = {"type": "string", "maxLength": 63, "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}
METADATA = closed({"name": STRING, "namespace": STRING, "labels": {"type": "object", "additionalProperties": STRING},
                   "annotations": {"type": "object", "additionalProperties": STRING}}, ("name",))
PROMETHEUS_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                                    r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
GATEWAY_DURATION = {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"}
LABEL_SELECTOR = closed({"matchLabels": {"type": "object", "additionalProperties": LABEL_VALUE},
                         "matchExpressions": {"type": "array", "items": ANY_OBJECT}})


def resource(api_version: str, kind: str, spec: dict) -> dict:
    return closed({"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": METADATA,
                   "spec": spec, "status": ANY_OBJECT}, ("apiVersion", "kind", "metadata", "spec"))


INFERENCE_POOL = resource("inference.networking.k8s.io/v1", "InferencePool", closed({
    "selector": closed({"matchLabels": {"type": "object", "additionalProperties": LABEL_VALUE,
                                        "minProperties": 1, "maxProperties": 64}}, ("matchLabels",)),
    "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "uniqueItems": True,
                    "items": closed({"number": PORT_NUMBER}, ("number",))},
    "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
    "endpointPickerRef": closed({
        "group": STRING, "kind": {"type": "string", "minLength": 1, "maxLength": 63},
        "name": {"type": "string", "minLength": 1, "maxLength": 253},
        "port": closed({"number": PORT_NUMBER}, ("number",)),
        "failureMode": {"enum": ["FailOpen", "FailClose"]},
    }, ("name",),
        # "port is required when kind is 'Service' or unspecified"
        **{"if": {"not": {"required": ["kind"]}}, "then": {"required": ["port"]},
           "else": {"if": {"properties": {"kind": {"const": "Service"}}}, "then": {"required": ["port"]}}}),
}, ("selector", "targetPorts")))

PARENT_REFERENCE = closed({"group": STRING, "kind": STRING, "namespace": STRING, "name": STRING,
                           "sectionName": STRING, "port": PORT_NUMBER}, ("name",))
BACKEND_REF = closed({"group": STRING, "kind": STRING, "name": STRING, "namespace": STRING, "port": PORT_NUMBER,
                      "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
                      "filters": {"type": "array", "items": ANY_OBJECT}}, ("name",),
                     # A Service (core group) needs its port; an InferencePool has none.
                     **{"if": {"properties": {"kind": {"const": "Service"}}, "required": ["kind"]},
                        "then": {"required": ["port"]}})
HTTP_ROUTE = resource("gateway.networking.k8s.io/v1", "HTTPRoute", closed({
    "parentRefs": {"type": "array", "maxItems": 32, "items": PARENT_REFERENCE},
    "hostnames": {"type": "array", "items": STRING},
    "rules": {"type": "array", "minItems": 1, "maxItems": 16, "items": closed({
        "name": STRING,
        "matches": {"type": "array", "maxItems": 64, "items": closed({
            "path": closed({"type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                            "value": {"type": "string", "pattern": "^/"}}),
            "headers": {"type": "array"}, "queryParams": {"type": "array"},
            "method": {"enum": ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]}})},
        "filters": {"type": "array", "items": ANY_OBJECT},
        "backendRefs": {"type": "array", "maxItems": 16, "items": BACKEND_REF},
        "timeouts": closed({"request": GATEWAY_DURATION, "backendRequest": GATEWAY_DURATION}),
        "retry": ANY_OBJECT, "sessionPersistence": ANY_OBJECT})},
}))

POD_METRICS_ENDPOINT = closed({
    "port": STRING, "portNumber": PORT_NUMBER, "targetPort": {"type": ["string", "integer"]}, "path": STRING,
    "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]}, "params": ANY_OBJECT, "interval": PROMETHEUS_DURATION,
    "scrapeTimeout": PROMETHEUS_DURATION, "honorLabels": {"type": "boolean"}, "honorTimestamps": {"type": "boolean"},
    "trackTimestampsStaleness": {"type": "boolean"}, "relabelings": {"type": "array"},
    "metricRelabelings": {"type": "array"}, "tlsConfig": ANY_OBJECT, "bearerTokenSecret": ANY_OBJECT,
    "basicAuth": ANY_OBJECT, "authorization": ANY_OBJECT, "oauth2": ANY_OBJECT, "followRedirects": {"type": "boolean"},
    "enableHttp2": {"type": "boolean"}, "filterRunning": {"type": "boolean"}, "proxyUrl": STRING})
POD_MONITOR = resource("monitoring.coreos.com/v1", "PodMonitor", closed({
    "jobLabel": STRING, "podTargetLabels": {"type": "array", "items": STRING}, "selector": LABEL_SELECTOR,
    "selectorMechanism": {"enum": ["RelabelConfig", "RoleSelector"]},
    "namespaceSelector": closed({"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": STRING}}),
    "podMetricsEndpoints": {"type": "array", "items": POD_METRICS_ENDPOINT},
    "sampleLimit": {"type": "integer"}, "targetLimit": {"type": "integer"}, "labelLimit": {"type": "integer"},
    "labelNameLengthLimit": {"type": "integer"}, "labelValueLengthLimit": {"type": "integer"},
    "keepDroppedTargets": {"type": "integer"}, "attachMetadata": ANY_OBJECT, "scrapeClass": STRING,
    "scrapeProtocols": {"type": "array"}, "fallbackScrapeProtocol": STRING, "bodySizeLimit": STRING,
}, ("selector",)))

CUSTOM_RESOURCES = {("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
                    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE,
                    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR}

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
    "queue-scorer": closed({}),
    "kv-cache-utilization-scorer": closed({}),
    "running-requests-size-scorer": closed({}),
    "max-score-picker": closed({}),
}
SCORERS = ("queue-scorer", "kv-cache-utilization-scorer", "running-requests-size-scorer")

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
