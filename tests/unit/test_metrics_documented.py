"""docs/metrics.md's tables list every metric the library defines, with the type it is made with."""
import re
from pathlib import Path

from tritonfront.core import encoding, rank_load as load
from tritonfront.core.rank_load import ModelMetricSpec

METRICS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def defined_metrics() -> list[ModelMetricSpec]:
    specs = []
    for module in (load, encoding):
        for value in vars(module).values():
            candidates = value.values() if isinstance(value, dict) else [value]
            specs += [spec for spec in candidates if isinstance(spec, ModelMetricSpec)]
    return specs


def documented() -> dict[str, str]:
    """metric name -> its type, from the table under docs/metrics.md's '## Metrics'."""
    section = METRICS_PAGE.read_text().split("## Metrics\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `((?:tritonfront|nv_trt_llm)_[a-z_]+)` \| (\w+) \|", section, flags=re.M)
    return dict(rows)


def test_every_metric_is_in_readme_with_its_type():
    specs = defined_metrics()
    assert len(specs) >= 14  # the llm's, the model totals, the encoder's
    table = documented()
    assert {spec.name: spec.kind for spec in specs} == table


def test_every_front_metric_is_in_readme_with_its_type_and_labels():
    from tritonfront.openai.metrics import METRICS

    section = METRICS_PAGE.read_text().split("## The OpenAI front's metrics\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9_:]+)` \| (\w+) \| ([a-z_, ]+) \|", section, flags=re.M)
    table = {name: (kind, tuple(label.strip() for label in labels.split(","))) for name, kind, labels in rows}
    assert table == {spec.name: (spec.kind, spec.labels) for spec in METRICS.values()}
