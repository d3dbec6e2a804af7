"""The few statistics the results use. NaN stands for "no value" (an empty list, a failed step)
and never reaches a percentile: a round with nothing measured must not look like zero."""
import math
import statistics
from typing import Callable, Iterable, Optional, Sequence

import numpy as np

NAN = float("nan")


def present(values: Iterable[Optional[float]]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(v)]


def percentile(values: Iterable[Optional[float]], q: float) -> float:
    values = present(values)
    return float(np.percentile(values, q)) if values else NAN


def mean(values: Iterable[Optional[float]]) -> float:
    values = present(values)
    return float(np.mean(values)) if values else NAN


def median(values: Iterable[Optional[float]]) -> float:
    values = present(values)
    return float(statistics.median(values)) if values else NAN


def ratio(numerator: Optional[float], denominator: Optional[float]) -> float:
    """numerator / denominator; NaN when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or math.isnan(numerator) or math.isnan(denominator) or not denominator:
        return NAN
    return numerator / denominator


def median_ratio(pairs: Iterable[tuple[float, float]]) -> float:
    """The median over rounds of numerator / denominator, each round compared within itself."""
    return median(ratio(a, b) for a, b in pairs)


def latency_summary(seconds: Sequence[float]) -> dict:
    """Mean, P50, P90, P99 and max in milliseconds."""
    ms = [s * 1000 for s in present(seconds)]
    return {"mean_ms": mean(ms), "p50_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90),
            "p99_ms": percentile(ms, 99), "max_ms": max(ms, default=NAN)}


def slope(times: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of values over times; NaN with fewer than 3 points."""
    if len(times) < 3:
        return NAN
    return float(np.polyfit(np.asarray(times, dtype=float), np.asarray(values, dtype=float), 1)[0])


def window_growth(times: Sequence[float], values: Sequence[float], window: float) -> dict:
    """How a noisy series grew: the median over the first `window` (time units) against the
    median over the last one, the largest value against that first median, and the linear
    trend per time unit. Medians over windows, not two single samples: a stub's RSS under load
    swings by 100 MiB as batches come and go."""
    if not len(times):
        raise ValueError("no samples")
    first, last = times[0], times[-1]
    early = [v for t, v in zip(times, values) if t <= first + window]
    late = [v for t, v in zip(times, values) if t >= last - window]
    base, end, peak = median(early), median(late), max(values)
    return {"base": base, "end": end, "peak": peak, "growth_end": ratio(end, base) - 1,
            "growth_peak": ratio(peak, base) - 1, "slope": slope(times, values),
            "early": (first, min(first + window, last)), "late": (max(last - window, first), last)}


def median_rate(run_once: Callable[[], int], seconds: float, min_runs: int = 3) -> float:
    """Items per second: the median over repeated runs of `run_once` (which returns how many items
    it handled) for `seconds`, at least `min_runs` runs."""
    import time

    rates: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(rates) < min_runs:
        start = time.perf_counter()
        items = run_once()
        rates.append(items / (time.perf_counter() - start))
    return statistics.median(rates)
