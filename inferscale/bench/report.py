"""Tables and plots shared by the reports of ``inferscale bench`` and ``inferscale eval``.

rich and matplotlib come from the ``apps`` extra and are imported only when a report is printed or plotted
(:mod:`inferscale.apps_extra`); a missing one raises :class:`~inferscale.errors.ConfigError` naming the extra.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from inferscale.apps_extra import console as make_console
from inferscale.apps_extra import pyplot
from inferscale.apps_extra import table as make_table

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

__all__ = ["figure", "grouped_bars", "percentile_lines", "print_ratios", "print_written", "report_table"]


@contextmanager
def figure(path: Path, figsize: tuple[float, float], *, ncols: int = 1, dpi: int = 120) -> Iterator[list[Any]]:
    """A matplotlib figure of ``ncols`` axes side by side, saved to ``path`` (PNG) and closed on exit.

    Yields:
        The axes, left to right.

    Raises:
        ConfigError: when matplotlib is not installed (the ``apps`` extra).
    """
    plt = pyplot()
    fig, axes = plt.subplots(1, ncols, figsize=figsize, dpi=dpi, squeeze=False)
    try:
        yield list(axes[0])
        fig.tight_layout()
        fig.savefig(path)
    finally:
        plt.close(fig)


def percentile_lines(
    ax: Any,
    xs: Sequence[float],
    p50: Sequence[float],
    p95: Sequence[float],
    label: str,
    *,
    p95_as: Literal["band", "line"],
    color: Any = None,
) -> Any:
    """Plot a median line with markers and its p95: shaded between the two (``band``) or dashed (``line``).

    Args:
        ax: the matplotlib axes.
        xs: the x values; ``p50``, ``p95``: medians and 95th percentiles at each x (same length).
        label: the median line's legend label (a dashed p95 line gets the same label with `` p95`` in place of
            a trailing `` p50``).
        p95_as: how the p95 is drawn.
        color: a matplotlib colour for both lines; ``None``: the next colour of the axes' cycle.

    Returns:
        The colour used (as matplotlib gives it: a name or an RGB(A) tuple).
    """
    (line,) = ax.plot(xs, p50, marker="o", label=label, color=color)
    used = line.get_color()
    if p95_as == "band":
        ax.fill_between(xs, p50, p95, color=used, alpha=0.15)
    else:
        ax.plot(xs, p95, linestyle="--", color=used, label=label.removesuffix(" p50") + " p95")
    return used


def grouped_bars(ax: Any, labels: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]]) -> None:
    """One group of bars per label, one bar per series (a missing value draws as 0).

    Args:
        ax: the matplotlib axes.
        labels: the group labels along x.
        series: ``(legend name, one value per label)`` for each bar of a group.
    """
    width = 0.8 / len(series)
    for j, (name, values) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=name)
    ax.set_xticks(range(len(labels)), list(labels))


def report_table(title: str, left: Sequence[str], right: Sequence[str], *, fold_left: bool = False) -> Table:
    """A rich table: ``left`` text columns, then ``right`` right-justified figure columns.

    Args:
        title: the table title.
        left, right: column headers.
        fold_left: fold long text in the left columns instead of cropping it.

    Raises:
        ConfigError: when rich is not installed (the ``apps`` extra).
    """
    table = make_table(title=title)
    for name in left:
        table.add_column(name, overflow="fold" if fold_left else "ellipsis")
    for name in right:
        table.add_column(name, justify="right")
    return table


def print_ratios(ratios: Mapping[str, float | None], console: Console | None = None) -> None:
    """Print ``name = value`` per ratio (``n/a`` for a missing one)."""
    console = console or make_console()
    for name, value in ratios.items():
        console.print(f"{name} = {value if value is not None else 'n/a'}")


def print_written(json_path: Path | None, png_path: Path | None, console: Console | None = None) -> None:
    """Print which files a report wrote (nothing before they are written)."""
    if json_path is not None:
        (console or make_console()).print(f"wrote {json_path} and {png_path}", style="dim")
