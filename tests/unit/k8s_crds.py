"""The custom resources of deploy/kubernetes validated against their published CRDs (tests/data/crds,
sources in SOURCES.md there), as an API server with strict field validation would take them: the
served version's openAPIV3Schema, read as JSON Schema, with every object that lists its properties
closed to any other field (the server prunes or, with `kubectl apply --validate=strict`, rejects an
unknown field), `nullable` and `x-kubernetes-int-or-string` read as the server reads them.

Not evaluated: the CRDs' CEL rules (`x-kubernetes-validations`, e.g. an InferencePool's
endpointPickerRef needing a port when its kind is Service); rules_of() lists them, so a test can
check the few the manifests depend on by hand."""
from functools import lru_cache
from pathlib import Path

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parents[1] / "data" / "crds"


@lru_cache(maxsize=None)
def definitions() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the served version's openAPIV3Schema, for every CRD file here."""
    found = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            if version.get("served"):
                found[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return found


def strict(schema: dict) -> dict:
    """The structural schema as JSON Schema, closed where Kubernetes knows every field."""
    if not isinstance(schema, dict):
        return schema
    converted = {key: value for key, value in schema.items() if not key.startswith("x-kubernetes-")}
    for key in ("properties", "patternProperties"):
        if key in converted:
            converted[key] = {name: strict(sub) for name, sub in converted[key].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(converted.get(key), dict):
            converted[key] = strict(converted[key])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in converted:
            converted[key] = [strict(sub) for sub in converted[key]]
    if schema.get("x-kubernetes-int-or-string"):
        converted["type"] = ["integer", "string"]
    if schema.get("nullable") and "type" in converted:
        converted["type"] = [*([converted["type"]] if isinstance(converted["type"], str) else converted["type"]), "null"]
    converted.pop("nullable", None)
    if ("properties" in converted and "additionalProperties" not in converted
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        converted["additionalProperties"] = False
    return converted


def schema_for(api_version: str, kind: str):
    """The strict JSON schema of a kind, or None when no CRD here defines it."""
    found = definitions().get((api_version, kind))
    return None if found is None else strict(found)


def validate(resource: dict) -> None:
    """jsonschema.ValidationError when the resource breaks its CRD's schema."""
    schema = schema_for(resource["apiVersion"], resource["kind"])
    if schema is None:
        raise LookupError(f"no published CRD here defines {resource['apiVersion']} {resource['kind']}")
    jsonschema.validate(resource, schema, cls=jsonschema.Draft7Validator)


def rules_of(api_version: str, kind: str) -> list[str]:
    """Every CEL rule in a kind's schema (not evaluated here)."""
    rules = []

    def walk(node):
        if isinstance(node, dict):
            rules.extend(rule["rule"] for rule in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(definitions()[(api_version, kind)])
    return rules
