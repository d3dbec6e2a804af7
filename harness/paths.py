"""Where things live: the repository, its committed model repositories, the benchmarks' own
baseline models, and where results go (published ones are committed, ad-hoc ones are not)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_REPOSITORY = ROOT / "model_repository"
ENSEMBLES = ROOT / "ensembles"
COMMITTED = (MODEL_REPOSITORY, ENSEMBLES)  # what scripts/serve.sh serves by default
BASELINES = ROOT / "perf" / "baseline_repository"  # benchmark-only models, never served by the product
RESULTS = ROOT / "perf" / "results"  # published results (--publish), committed
RAW = RESULTS / "raw"  # server logs, raw JSON, ad-hoc reports: ignored by git
