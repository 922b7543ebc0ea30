"""Draws the bench's plot: kube-svm's engine, objects/s against its write window, with the
apiserver's limit and the other migrators as horizontal lines. Reads docs/bench.json."""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LINES = {
    "limit-64": ("the limit: bare client, 64 in flight", "black", "-"),
    "limit-16": ("bare client, 16 in flight", "grey", "--"),
    "kube-svm-controller": ("kube-svm controller, defaults, end to end", "tab:blue", ":"),
    "in-tree": ("in-tree migrator (kube-controller-manager)", "tab:orange", "-."),
    "upstream-model": ("kube-storage-version-migrator (model)", "tab:red", "--"),
}


def main(source: str, target: str) -> None:
    with open(source) as f:
        bench = json.load(f)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    sweep = sorted((int(k), v) for k, v in bench.get("sweep", {}).items())
    if sweep:
        xs, ys = zip(*sweep)
        ax.plot(xs, ys, marker="o", color="tab:blue", label="kube-svm engine, at most N writes in flight")
    for row in bench["rows"]:
        if row["contender"] in LINES:
            label, color, style = LINES[row["contender"]]
            ax.axhline(row["objects_per_second"], color=color, linestyle=style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("writes in flight")
    ax.set_ylabel("objects/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Migrating {bench['objects']:,} custom resources of about {bench['bytes']} bytes")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    fig.tight_layout()
    fig.savefig(target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
