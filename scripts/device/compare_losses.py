"""Compare two training runs' losses step by step from their metrics.jsonl (the last record of each step wins:
a resumed run appends to its file).

    python scripts/device/compare_losses.py A/metrics.jsonl B/metrics.jsonl [--rtol 1e-6]

Prints one row per step and the largest relative difference; exits 1 when it exceeds --rtol or a step is missing.
"""

import argparse
import json
import sys


def losses(path: str) -> dict[int, float]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if record.get("split") == "train":
                out[int(record["step"])] = float(record["loss"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rtol", type=float, default=1e-6)
    args = p.parse_args(argv)
    a, b = losses(args.a), losses(args.b)
    worst = 0.0
    print("| step | loss A | loss B | rel. diff |\n|---:|---:|---:|---:|")
    for step in sorted(set(a) | set(b)):
        if step not in a or step not in b:
            print(f"| {step} | {a.get(step, '-')} | {b.get(step, '-')} | missing |")
            worst = float("inf")
            continue
        rel = abs(a[step] - b[step]) / max(abs(a[step]), 1e-30)
        worst = max(worst, rel)
        print(f"| {step} | {a[step]:.9g} | {b[step]:.9g} | {rel:.2e} |")
    print(f"largest relative difference {worst:.2e} (rtol {args.rtol:g})")
    return 0 if worst <= args.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
