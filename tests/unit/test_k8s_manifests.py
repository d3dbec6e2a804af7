"""deploy/kubernetes, checked offline (no cluster, kubectl or kustomize here): every built-in
resource against Kubernetes' own schemas (kubernetes-validate, strict: an unknown field fails), at
the oldest and the newest Kubernetes version it knows of those still in support; the custom
resources, which it has no schema for, against their documented fields (k8s_schemas); the GPU
overlay applied to the base as kustomize applies a strategic merge patch and validated the same
way; and the references between the files (labels, ports, names, the autoscaler's metric)."""
import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

import k8s_schemas

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
BASE, GPU = KUBERNETES / "base", KUBERNETES / "overlays" / "gpu"
VERSIONS = ("1.30.0", "1.37.0")
MEASURED_STARTUP_S = 80  # the slowest start to ready measured on the 2-core machine (README: Use it)


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def kustomization(folder: Path) -> dict:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def base_resources() -> list[dict]:
    return [doc for name in kustomization(BASE)["resources"] for doc in documents(BASE / name)]


def find(resources: list[dict], kind: str, name: str) -> dict:
    found = [r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name}"
    return found[0]


def validate(resource: dict) -> None:
    """Kubernetes' schemas for its own kinds, ours for the custom resources."""
    schema = k8s_schemas.CUSTOM_RESOURCES.get((resource["apiVersion"], resource["kind"]))
    if schema is not None:
        jsonschema.validate(resource, schema)
        return
    for version in VERSIONS:
        kubernetes_validate.validate(resource, version, strict=True)


def strategic_merge(base, patch):
    """kustomize's strategic merge for what the overlay patches: maps merge key by key, lists of
    objects with a name (containers, env, volumes) merge item by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = strategic_merge(base[key], value) if key in base else value
        return merged
    if (isinstance(base, list) and isinstance(patch, list) and patch
            and all(isinstance(item, dict) and "name" in item for item in [*base, *patch])):
        merged, names = [dict(item) for item in base], [item["name"] for item in base]
        for item in patch:
            if item["name"] in names:
                merged[names.index(item["name"])] = strategic_merge(merged[names.index(item["name"])], item)
            else:
                merged.append(item)
        return merged
    return copy.deepcopy(patch)


def gpu_resources() -> list[dict]:
    overlay = kustomization(GPU)
    assert overlay["resources"] == ["../../base"]
    resources = base_resources()
    for patch in overlay["patches"]:
        target = find(resources, patch["target"]["kind"], patch["target"]["name"])
        (change,) = documents(GPU / patch["path"])
        assert (change["kind"], change["metadata"]["name"]) == (target["kind"], target["metadata"]["name"])
        resources[resources.index(target)] = strategic_merge(target, change)
    return resources


def container(deployment: dict, name: str = "tritonfront") -> dict:
    (found,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


@pytest.mark.parametrize("resources", [base_resources, gpu_resources], ids=["base", "gpu"])
def test_every_resource_validates(resources):
    seen = resources()
    for resource in seen:
        validate(resource)
    assert {r["kind"] for r in seen} >= {"Deployment", "Service", "PodMonitor", "HorizontalPodAutoscaler",
                                          "InferencePool", "HTTPRoute", "ConfigMap"}


def test_the_base_lists_every_manifest_and_nothing_else():
    assert sorted(kustomization(BASE)["resources"]) == sorted(p.name for p in BASE.glob("*.yaml")
                                                              if p.name != "kustomization.yaml")


def test_a_misspelt_field_fails_validation():
    deployment = copy.deepcopy(find(base_resources(), "Deployment", "tritonfront"))
    container(deployment)["startupProbe"]["failureTreshold"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    pool = copy.deepcopy(find(base_resources(), "InferencePool", "tritonfront"))
    pool["spec"]["endpointPickerRef"]["failuremode"] = "FailOpen"
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)
    del pool["spec"]["endpointPickerRef"]["failuremode"], pool["spec"]["endpointPickerRef"]["port"]
    with pytest.raises(jsonschema.ValidationError):  # a Service reference needs its port
        validate(pool)


def test_probes_watch_readiness_and_give_model_load_its_time():
    spec = container(find(base_resources(), "Deployment", "tritonfront"))
    ports = {port["name"]: port["containerPort"] for port in spec["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert spec["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert spec["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = spec["startupProbe"]
    assert startup["httpGet"]["port"] in ports
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3 * MEASURED_STARTUP_S
    env = {item["name"]: item["value"] for item in spec["env"]}
    assert env == {"BIND_ADDRESS": "0.0.0.0", "TRITONFRONT_REPOSITORIES": ""}  # the committed CPU configs
    assert spec["resources"]["requests"]["cpu"] == "2"
    volumes = find(base_resources(), "Deployment", "tritonfront")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["volumeMounts"]
    assert [v["emptyDir"]["medium"] for v in volumes if v["name"] == "dshm"] == ["Memory"]


def test_the_gpu_variant_asks_for_a_gpu_and_serves_the_images_gpu_deployment():
    spec = container(find(gpu_resources(), "Deployment", "tritonfront"))
    assert spec["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {item["name"]: item["value"] for item in spec["env"]}
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"ENV TRITONFRONT_REPOSITORIES={env['TRITONFRONT_REPOSITORIES']}" in dockerfile
    assert env["BIND_ADDRESS"] == "0.0.0.0"  # merged by name, not replaced
    assert spec["readinessProbe"] == container(find(base_resources(), "Deployment", "tritonfront"))["readinessProbe"]
    assert spec["startupProbe"]["failureThreshold"] > 30


def test_the_service_pool_and_monitor_select_the_replicas_and_their_ports():
    resources = base_resources()
    deployment = find(resources, "Deployment", "tritonfront")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    ports = {port["name"]: port["containerPort"] for port in container(deployment)["ports"]}

    def selects(selector: dict) -> bool:
        return selector.items() <= pod_labels.items()

    assert selects(deployment["spec"]["selector"]["matchLabels"])
    service = find(resources, "Service", "tritonfront")
    assert selects(service["spec"]["selector"]) and {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    monitor = find(resources, "PodMonitor", "tritonfront")
    assert selects(monitor["spec"]["selector"]["matchLabels"])
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    pool = find(resources, "InferencePool", "tritonfront")
    assert selects(pool["spec"]["selector"]["matchLabels"])
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [ports["http"]]
    picker = pool["spec"]["endpointPickerRef"]
    picker_service = find(resources, "Service", picker["name"])
    assert picker["port"]["number"] in {p["port"] for p in picker_service["spec"]["ports"]}
    route = find(resources, "HTTPRoute", "tritonfront")
    backends = [ref for rule in route["spec"]["rules"] for ref in rule["backendRefs"]]
    assert {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "tritonfront"} in backends
    generation = route["spec"]["rules"][0]["matches"][0]["path"]["value"]
    assert generation == "/v2/models/generate/"


def test_the_picker_runs_with_its_config_and_watches_the_pool():
    resources = base_resources()
    picker = find(resources, "Deployment", "tritonfront-epp")
    spec = picker["spec"]["template"]["spec"]
    args = dict(arg[2:].split("=", 1) for arg in container(picker, "epp")["args"])
    assert args["pool-name"] == find(resources, "InferencePool", "tritonfront")["metadata"]["name"]
    (mount,) = container(picker, "epp")["volumeMounts"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    config = find(resources, "ConfigMap", volume["configMap"]["name"])
    assert Path(args["config-file"]).parent == Path(mount["mountPath"])
    assert Path(args["config-file"]).name in config["data"]
    role = find(resources, "Role", "tritonfront-epp")
    watched = {(group, res) for rule in role["rules"] for group in rule["apiGroups"] for res in rule["resources"]}
    assert {("", "pods"), ("inference.networking.k8s.io", "inferencepools")} <= watched
    assert spec["serviceAccountName"] == find(resources, "RoleBinding", "tritonfront-epp")["subjects"][0]["name"]


def test_the_autoscaler_reads_the_metric_the_adapter_rule_serves():
    hpa = find(base_resources(), "HorizontalPodAutoscaler", "tritonfront")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "tritonfront"}
    (metric,) = hpa["spec"]["metrics"]
    values = yaml.safe_load((KUBERNETES / "prometheus-adapter-values.yaml").read_text())
    jsonschema.validate(values, k8s_schemas.PROMETHEUS_ADAPTER_VALUES)
    (rule,) = values["rules"]["custom"]
    assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == rule["name"]["as"]
    # Triton's queue-to-compute ratio, per pod, as the tutorial computes it.
    query = rule["metricsQuery"]
    assert "rate(nv_inference_queue_duration_us{<<.LabelMatchers>>" in query
    assert "rate(nv_inference_compute_infer_duration_us{<<.LabelMatchers>>" in query
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    assert hpa["spec"]["minReplicas"] >= 2
