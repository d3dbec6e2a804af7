"""Through Triton against an in-process ceiling, never both at once (they would share the cores)
but alternating, the in-process runs with the server up and idle: C0 T0 C1 T1 ... Cn. Each Triton
measurement is compared with the mean of the ceilings just before and just after it, so drift
in what else runs on the machine hits both sides; the verdict is the median over rounds."""
from typing import Callable

from .accounting import OtherWork
from .report import plt, verdict
from .stats import median


class CeilingRounds:
    def __init__(self, measure: Callable[[], float], unit: str = "texts/s", digits: int = 1):
        self.measure, self.unit, self.digits = measure, unit, digits
        self.ceilings: list[float] = []
        self.others: list[float] = []  # other work's cores during each ceiling measurement
        self.ratios: list[float] = []  # per round: the best Triton rate / its bracket

    def ceiling(self) -> float:
        with OtherWork() as others:
            rate = self.measure()
        self.ceilings.append(rate)
        self.others.append(others.cores)
        print(f"in-process ceiling: {rate:.{self.digits}f} {self.unit}", flush=True)
        return rate

    def bracket(self, k: int) -> float:
        """The ceiling around the Triton measurement made after the k-th ceiling."""
        return (self.ceilings[k] + self.ceilings[k + 1]) / 2

    def add_round(self, k: int, best_rate: float) -> None:
        self.ratios.append(best_rate / self.bracket(k))

    def ceiling_row(self, k: int, label: str, width: int, others_column: int) -> list:
        """A table row of the k-th ceiling: label, "-", rate, then "-" but for other work."""
        row = [label, "-", self.ceilings[k]] + ["-"] * (width - 3)
        row[others_column] = self.others[k]
        return row

    def summary(self, target_percent: float, through: str = "through Triton") -> str:
        d = self.digits
        return (f"- in-process ceiling: {min(self.ceilings):.{d}f}-{max(self.ceilings):.{d}f} {self.unit} over the "
                f"run (median {median(self.ceilings):.{d}f})\n"
                f"- {through}, best concurrency per round: {', '.join(f'{x:.0%}' for x in self.ratios)} of ceiling "
                f"-> median {verdict(median(self.ratios) * 100, target_percent, '%')}\n")


def run_order_plot(rows: list[list], title: str, ylabel: str, ax=None):
    """Bars of rows (label, concurrency or "-", rate ...) in run order: ceilings grey, Triton blue."""
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 4))
    xs = range(len(rows))
    ax.bar(xs, [row[2] for row in rows], color=["grey" if row[1] == "-" else "tab:blue" for row in rows])
    ax.set_xticks(list(xs), [row[0].replace(": ", "\n").replace("Triton, ", "")
                             + (f"\nc={row[1]}" if row[1] != "-" else "") for row in rows], fontsize=6)
    ax.set(ylabel=ylabel, title=title)
    return fig
