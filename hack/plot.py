"""Draws the bench's plot: what each contender moves (objects/s) against what the cluster's own
traffic feels of it (the foreground client's p99 latency while it runs). kube-svm's engine swept
over fixed write windows and over gentle latency bands draws two curves; every contender is a
point; the idle apiserver's p99, and five times it, are vertical lines. Reads docs/bench.json."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

POINTS = {
    "limit-64": ("bare client, 64 in flight", "black", "s"),
    "limit-16": ("bare client, 16 in flight", "grey", "s"),
    "kube-svm-controller": ("kube-svm controller, gentle (default)", "tab:blue", "o"),
    "kube-svm-controller-fast": ("kube-svm controller, fast", "tab:purple", "o"),
    "kube-svm-controller-flowcontrol": ("kube-svm, gentle, flowControl", "tab:cyan", "D"),
    "kube-svm-controller-fast-flowcontrol": ("kube-svm, fast, flowControl", "tab:pink", "D"),
    "in-tree": ("in-tree migrator (kube-controller-manager)", "tab:orange", "^"),
    "upstream-model": ("kube-storage-version-migrator (model)", "tab:red", "v"),
}


def p99(entry):
    foreground = entry.get("foreground")
    return foreground["p99_ms"] if foreground else None


def main(source: str, target: str) -> None:
    with open(source) as f:
        bench = json.load(f)
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=120)
    sweep = [p for p in bench.get("sweep", []) if p99(p) is not None]
    for pace, label, color in (
        ("fast", "kube-svm engine, fixed windows (1 to 64)", "tab:green"),
        ("gentle", "kube-svm engine, gentle bands", "tab:blue"),
    ):
        points = sorted((p99(p), p["objects_per_second"], p["setting"]) for p in sweep if p["pace"] == pace)
        if points:
            xs, ys, names = zip(*points)
            ax.plot(xs, ys, marker=".", linestyle="-", color=color, alpha=0.6, label=label)
            for x, y, name in points:
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, -10), fontsize="x-small", color=color)
    for row in bench["rows"]:
        if row["contender"] in POINTS and p99(row) is not None:
            label, color, marker = POINTS[row["contender"]]
            ax.scatter(p99(row), row["objects_per_second"], color=color, marker=marker, s=50, zorder=3, label=label)
    idle = [p99(r) for r in bench["rows"] if r["contender"].startswith("idle") and p99(r) is not None]
    if idle:
        base = min(idle)
        ax.axvline(base, color="grey", linestyle=":", label=f"idle apiserver ({base:.1f} ms)")
        ax.axvline(5 * base, color="grey", linestyle="--", label="5 × idle")
    ax.set_xscale("log")
    ax.set_xlabel("foreground client's p99 latency while the contender runs (ms)")
    ax.set_ylabel("objects/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Migrating {bench['objects']:,} custom resources of about {bench['bytes']} bytes")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", loc="best")
    fig.tight_layout()
    fig.savefig(target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
