"""``--plot``: % of the copy against T for each operation, one line per operation."""

from __future__ import annotations


def plot(results, path, backend):
    """Save a plot of ``results`` (bf16 cases of the first case's H, E and K, at two or more
    token counts) to ``path``; ``backend`` names the run in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first = results[0].case
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for op in dict.fromkeys(r.op for r in results):
        series = sorted(
            (r.case.tokens, r.percent)
            for r in results
            if r.op == op
            and r.case.dtype == "bf16"
            and (r.case.hidden, r.case.experts, r.case.topk)
            == (first.hidden, first.experts, first.topk)
        )
        if len(series) > 1:
            ax.plot(*zip(*series, strict=True), marker="o", label=op)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens T")
    ax.set_ylabel(f"% of copy bandwidth (same bytes, {results[0].modes[0]} time)")
    ax.set_ylim(bottom=0)
    shape = f"bf16 H={first.hidden} E={first.experts} K={first.topk}"
    ax.set_title(f"moe-numba, {shape}\n{backend}", fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_lines():
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
