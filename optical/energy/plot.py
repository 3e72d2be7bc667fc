"""Stacked-bar figure of an optical prefill against the GPU (matplotlib, Agg).

matplotlib is an optional dependency (``pip install 'optical[plot]'``); it is
imported only when a figure is drawn.
"""

from __future__ import annotations

from pathlib import Path

from optical.energy.gpu import GPUReport
from optical.energy.model import COMPONENTS, PrefillEnergy

__all__ = ["plot_breakdown"]


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ValueError("plotting needs matplotlib: pip install 'optical[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_path(path: str | Path, option: str = "path") -> Path:
    """``path`` with a figure format's suffix (``.png`` added when it has
    none); ValueError naming ``option`` for a suffix no format has."""
    from optical.plots import FORMATS

    path = Path(path)
    if not path.suffix:
        return path.with_name(path.name + ".png")
    if path.suffix.lower().lstrip(".") not in FORMATS:
        raise ValueError(f"{option} {path}: unknown figure format {path.suffix!r}; valid: "
                         f"{', '.join('.' + f for f in FORMATS)} (no suffix: .png)")
    return path


def plot_breakdown(optical: PrefillEnergy, gpu: GPUReport, path: str | Path) -> Path:
    """Draw energy per prompt token (optical stacked by component, GPU) and
    time to first token, and save the figure to ``path`` (format from its
    suffix: png, svg or pdf; no suffix: ``.png`` is added).

    Returns
    -------
    Path
        Where the figure was written.
    """
    path = figure_path(path)
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = optical.batch * optical.tokens
    fig, (ax_e, ax_t) = plt.subplots(1, 2, figsize=(10, 4.5),
                                     gridspec_kw={"width_ratios": [3, 2]})
    bottom = 0.0
    palette = plt.get_cmap("tab10")
    colors = [palette(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]  # no grey: that is the GPU
    for color, name in zip(colors, COMPONENTS, strict=True):
        value = optical.components[name] / tokens
        if value <= 0:
            continue
        ax_e.bar("optical", value, bottom=bottom, color=color, label=name)
        bottom += value
    ax_e.bar(gpu.gpu.name, gpu.per_token, color="0.3", label=f"GPU (x{gpu.gpus})")
    ax_e.set_ylabel("energy per prompt token (J)")
    ax_e.set_title(f"{optical.model or 'model'}: {optical.tokens} tokens x batch {optical.batch}",
                   fontsize=10)
    names = ["optical", gpu.gpu.name]
    # Not palette(0): that colour is the laser's in the shared legend.
    ax_t.bar(names, [optical.ttft, gpu.time], color=["white", "0.3"], edgecolor="black")
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time to first token (s)")
    fig.legend(loc="center right", fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.85, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
