"""Summarise a jax.profiler trace (e.g. the trainer's `profile.steps` window) without TensorBoard:

    python scripts/profile_summary.py runs/x/profile [--top 30] [--json out.json] [--events out.npz]

For each GPU in the trace: the span of its XLA modules (wall time on the device), how long its streams were
busy, host<->device copy time and bytes, the overlap of compute and communication (kernels of every stream:
compute busy, collectives busy, and the collective time during which no compute kernel ran, i.e. exposed
communication or waiting for a slower peer), and the ops (the "XLA Ops" line: HLO fusions, custom calls such as the
attention kernels, copies) that took the most time, each with its share of the span. Plain CPU traces have no
device planes; the script then says so.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from collections import defaultdict


def _trace_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    files = sorted(glob.glob(os.path.join(path, "**", "*.xplane.pb"), recursive=True))
    if not files:
        raise SystemExit(f"no *.xplane.pb under {path}")
    return files


def _busy_ns(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals."""
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def _intersection_ns(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of (union of a) intersected with (union of b)."""
    return _busy_ns(a) + _busy_ns(b) - _busy_ns(a + b)


def _is_collective(name: str) -> bool:
    return "nccl" in name.lower()


def overlap(kernels: list[tuple[str, int, int]]) -> dict:
    """Seconds of compute busy, collectives busy, and collective time with no compute kernel running
    (``exposed_collective_s``), from (name, start_ns, end_ns) kernel events of every stream; copies count as
    neither."""
    comp = [(s, e) for n, s, e in kernels if not _is_collective(n) and _copy_kind(n) is None]
    coll = [(s, e) for n, s, e in kernels if _is_collective(n)]
    both = _intersection_ns(comp, coll)
    return {"compute_busy_s": _busy_ns(comp) / 1e9, "collective_busy_s": _busy_ns(coll) / 1e9,
            "exposed_collective_s": (_busy_ns(coll) - both) / 1e9}


def _op_family(name: str) -> str:
    """A coarse bucket for an HLO op name (fusion.123 -> fusion, custom-call names kept)."""
    return re.sub(r"[._]\d+$", "", name)


_COPY_KINDS = {"HtoD": ("htod", "h2d", "hosttodevice"), "DtoH": ("dtoh", "d2h", "devicetohost"),
               "DtoD": ("dtod", "d2d", "devicetodevice")}


def _copy_kind(name: str) -> str | None:
    low = name.lower().replace(" ", "").replace("_", "")
    if "memcpy" not in low and "copy" not in low:
        return None
    return next((k for k, keys in _COPY_KINDS.items() if any(key in low for key in keys)), None)


def summarize_plane(plane) -> dict:
    """Per line of the device plane: events, busy time and the heaviest event names. Op names come from the
    "XLA Ops" line where the trace has one, else from the kernel (stream) lines."""
    lines, copies = [], {k: [0.0, 0] for k in _COPY_KINDS}
    module_span = [None, None]
    stream_intervals: list[tuple[int, int]] = []
    kernels: list[tuple[str, int, int]] = []
    for line in plane.lines:
        events = list(line.events)
        names: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        intervals = []
        for e in events:
            names[e.name] += e.duration_ns
            counts[e.name] += 1
            intervals.append((int(e.start_ns), int(e.end_ns)))
            kind = _copy_kind(e.name)
            if kind and not line.name.startswith("XLA"):
                copies[kind][0] += e.duration_ns
                m = re.search(r"(?:size|bytes)\D{0,3}(\d+)", " ".join(str(v) for v in dict(e.stats).values()))
                copies[kind][1] += int(m.group(1)) if m else 0
        if line.name == "XLA Modules" and intervals:
            module_span = [min(s for s, _ in intervals), max(t for _, t in intervals)]
        if not line.name.startswith("XLA"):
            stream_intervals += intervals
            kernels += [(e.name, int(e.start_ns), int(e.end_ns)) for e in events]
        lines.append({"line": line.name, "events": len(events), "busy_s": _busy_ns(intervals) / 1e9,
                      "ops": sorted(({"op": k, "s": v / 1e9, "calls": counts[k]} for k, v in names.items()),
                                    key=lambda r: -r["s"])})
    span = (module_span[1] - module_span[0]) if module_span[0] is not None else None
    op_line = next((ln for ln in lines if ln["line"] == "XLA Ops"), None)
    if op_line is None:  # no HLO-op line: merge the kernel lines
        merged: dict[str, list] = defaultdict(lambda: [0.0, 0])
        for ln in lines:
            if not ln["line"].startswith("XLA"):
                for r in ln["ops"]:
                    merged[r["op"]][0] += r["s"]
                    merged[r["op"]][1] += r["calls"]
        ops = sorted(({"op": k, "s": v[0], "calls": v[1]} for k, v in merged.items()), key=lambda r: -r["s"])
    else:
        ops = op_line["ops"]
    return {"device": plane.name, "span_s": span / 1e9 if span else None,
            "stream_busy_s": _busy_ns(stream_intervals) / 1e9, "overlap": overlap(kernels),
            "copies": {k: {"s": v[0] / 1e9, "gb": v[1] / 1e9} for k, v in copies.items()},
            "lines": [{k: v for k, v in ln.items() if k != "ops"} | {"top": ln["ops"][:5]} for ln in lines],
            "ops": ops}


def write_events(planes, path: str) -> None:
    """Every kernel of every device plane as a compact timeline (``--events``): a whole multi-GPU step's trace is
    too large to bring back from a lent machine, its kernels are not. The npz holds, per kernel, ``device``,
    ``line`` (indices into ``devices`` / ``lines``), ``name`` (index into ``names``), ``start_ns`` (from the
    earliest kernel of the trace) and ``dur_ns``; the "XLA Ops" line is kept too (HLO op names, e.g. which
    fusion or custom call a kernel belongs to)."""
    import numpy as np  # noqa: PLC0415 - only this option needs it

    names: dict[str, int] = {}
    lines: dict[str, int] = {}
    cols: dict[str, list[int]] = {k: [] for k in ("device", "line", "name", "start_ns", "dur_ns")}
    for d, plane in enumerate(planes):
        for line in plane.lines:
            if line.name.startswith("XLA") and line.name != "XLA Ops":
                continue
            li = lines.setdefault(line.name, len(lines))
            for e in line.events:
                cols["device"].append(d)
                cols["line"].append(li)
                cols["name"].append(names.setdefault(e.name, len(names)))
                cols["start_ns"].append(int(e.start_ns))
                cols["dur_ns"].append(int(e.duration_ns))
    start = np.asarray(cols["start_ns"], np.int64)
    t0 = int(start.min()) if start.size else 0
    np.savez_compressed(path, devices=np.asarray([p.name for p in planes]), lines=np.asarray(list(lines)),
                        names=np.asarray(list(names)), device=np.asarray(cols["device"], np.int16),
                        line=np.asarray(cols["line"], np.int16), name=np.asarray(cols["name"], np.int32),
                        start_ns=start - t0, dur_ns=np.asarray(cols["dur_ns"], np.int64))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a profile directory (searched for *.xplane.pb) or one .xplane.pb file")
    p.add_argument("--top", type=int, default=30, help="ops to list per device")
    p.add_argument("--json", default=None, help="also write the summary as JSON here")
    p.add_argument("--events", default=None,
                   help="also write every device kernel (and XLA op) as a compact timeline here (.npz)")
    args = p.parse_args(argv)
    from jax.profiler import ProfileData  # noqa: PLC0415 - keep --help fast

    out, all_planes, traces = [], [], []
    for path in _trace_files(args.trace):
        data = ProfileData.from_file(path)
        traces.append(data)  # its planes are views into it
        planes = [pl for pl in data.planes if pl.name.startswith("/device:GPU") or pl.name.startswith("/device:TPU")]
        if not planes:
            print(f"{path}: no GPU/TPU device planes (a CPU-only trace)")
        all_planes += planes
        for plane in planes:
            s = summarize_plane(plane)
            out.append(s)
            span = s["span_s"] or s["stream_busy_s"]
            print(f"\n{path}\n{s['device']}: modules span {span:.3f} s, streams busy {s['stream_busy_s']:.3f} s")
            o = s["overlap"]
            print(f"  compute kernels busy {o['compute_busy_s']:.3f} s, collectives busy {o['collective_busy_s']:.3f} s, "
                  f"collectives with no compute running (exposed or waiting for a peer) {o['exposed_collective_s']:.3f} s")
            for ln in s["lines"]:
                top = ", ".join(f"{r['op'][:40]} {r['s']:.3f}" for r in ln["top"][:3])
                print(f"  line {ln['line']!r}: {ln['events']} events, busy {ln['busy_s']:.3f} s; top: {top}")
            for kind, c in s["copies"].items():
                if c["s"]:
                    print(f"  memcpy {kind}: {c['s']:.3f} s, {c['gb']:.2f} GB"
                          + (f" ({c['gb'] / c['s']:.1f} GB/s)" if c["gb"] else ""))
            families: dict[str, float] = defaultdict(float)
            for r in s["ops"]:
                families[_op_family(r["op"])] += r["s"]
            print("  | op | calls | s | % of span |\n  |---|---:|---:|---:|")
            for r in s["ops"][: args.top]:
                print(f"  | {r['op'][:60]} | {r['calls']} | {r['s']:.3f} | {100 * r['s'] / span:.1f} |")
            print("  families: " + ", ".join(f"{k} {v:.2f} s" for k, v in
                                             sorted(families.items(), key=lambda kv: -kv[1])[:12]))
    if args.events:
        write_events(all_planes, args.events)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
