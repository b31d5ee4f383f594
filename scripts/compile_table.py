"""The "compiled, not run" tables of docs/compile_only.md ("Results"): the project's own ``--compile-only``
command per topology x config x row length, on this host (no TPU or GPU needed).

    python scripts/compile_table.py                     # every row below, 2 compiles at a time
    python scripts/compile_table.py --only tpu --jobs 3
    python scripts/compile_table.py --markdown          # print the tables from the stored results only

Each row runs ``python -m longrm_jax.train --config C --compile-only --topology T --set ...`` in its own process
and reads what it prints (peak GiB per chip against the device budget, the remat policy, the step time at 40% MFU,
Mosaic kernels and collectives), or the memory plan's message when the step does not fit (exit status 4).
Results are kept in ``docs/results/compile_table.json`` (a row already there is not compiled again unless
``--force``); the markdown tables are printed at the end. An 8B step takes minutes to compile.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from longrm_jax.training.compile_only import GPU_COMPILE_MARGIN_GIB  # noqa: E402
RESULTS = os.path.join(ROOT, "docs", "results", "compile_table.json")

SIMPO, SFT, BT = ("configs/qwen3_8b_grm_simpo_tpu.yaml", "configs/qwen3_8b_grm_sft_tpu.yaml",
                  "configs/llama31_8b_disrm_bt_lora_tpu.yaml")
CONFIG_LABELS = {SIMPO: "Qwen3-8B SimPO", SFT: "Qwen3-8B SFT", BT: "Llama-3.1-8B BT LoRA r=8"}


def _mesh(fsdp: int, seq: int, rows_per_step: int = 8) -> list[str]:
    """The shipped TPU configs' recipe on another slice: seq for the ring, fsdp over the rest, one row per fsdp
    group per micro step and grad_accum for the 8 rows of an optimizer step."""
    return [f"mesh.fsdp={fsdp}", f"mesh.seq={seq}", f"data.batch_rows={fsdp}",
            f"grad_accum={max(1, rows_per_step // fsdp)}"]


def rows() -> list[dict]:
    """Every row of the tables: id, group (tpu | gpu), config, topology, --set overrides, what it shows."""
    out = []
    for config in (SIMPO, SFT, BT):
        name = os.path.basename(config).removesuffix(".yaml")
        for topo, sets in (("v5p-64", []), ("v5p-8", _mesh(1, 4)), ("v6e-8", _mesh(1, 8)),
                           ("v6e-16", _mesh(2, 8))):
            out.append(dict(id=f"{name}@{topo}", group="tpu", config=config, topology=topo, sets=sets,
                            length="128K (131,072)"))
    # The memory plan refusing: 256K-token rows on a v5p-8 (ring over its 4 chips: 64K tokens per chip).
    out.append(dict(id="qwen3_8b_grm_simpo_tpu@v5p-8@256K", group="tpu-oversized", config=SIMPO,
                    topology="v5p-8", sets=["data.seq_len=262144", *_mesh(1, 4)], length="256K (262,144)",
                    label="SimPO on 262,144-token rows on a v5p-8 (`mesh.seq: 4`)"))
    # The example of a hopeless request: 1M-token rows on a v5p-8 with no ring (refused before compiling).
    out.append(dict(id="qwen3_8b_grm_simpo_tpu@v5p-8@1M", group="tpu-oversized", config=SIMPO, topology="v5p-8",
                    sets=["data.seq_len=1048576", "mesh.seq=1", "mesh.fsdp=4", "data.batch_rows=4", "grad_accum=2"],
                    length="1M (1,048,576)", label="SimPO on 1,048,576-token rows on a v5p-8 (`mesh.seq: 1`)"))
    # GPU meshes: the 1M-token Qwen3-8B step (ring over 8 GPUs, pallas blocks), and SimPO pairs on 2 and 4 GPUs.
    # The MLP runs in 8,192-token tiles (model.mlp_chunk_tokens, exact) except in the one row that shows why.
    gpu_base = ["model.preset=qwen3_8b", "model.param_dtype=bfloat16"]
    gpu_common = [*gpu_base, "model.remat=full"]
    tiled = [*gpu_common, "model.mlp_chunk_tokens=8192"]
    one_m = ["data.seq_len=1048576", "data.batch_rows=1", "grad_accum=1", "mesh.seq=8", "mesh.fsdp=1"]
    out.append(dict(id="qwen3_8b_sft_1M@h100x8", group="gpu", config="configs/qwen3_8b_grm_sft.yaml",
                    topology="h100x8", length="1 x 1M (1,048,576)", label="SFT, one 1M-token row, untiled MLP",
                    sets=[*gpu_common, *one_m]))
    for topo in ("h100x8", "h200x8"):
        out.append(dict(id=f"qwen3_8b_sft_1M_mlp8k@{topo}", group="gpu", config="configs/qwen3_8b_grm_sft.yaml",
                        topology=topo, length="1 x 1M (1,048,576)", label="SFT, one 1M-token row",
                        sets=[*tiled, *one_m]))
    # Where remat ``full`` leaves too little room: the layer inputs offloaded to pinned host memory.
    offload = [*gpu_base, "model.mlp_chunk_tokens=8192", "model.remat=offload_layer_inputs"]
    out.append(dict(id="qwen3_8b_sft_1M_offload@h100x8", group="gpu", config="configs/qwen3_8b_grm_sft.yaml",
                    topology="h100x8", length="1 x 1M (1,048,576)",
                    label="SFT, one 1M-token row, `offload_layer_inputs`", sets=[*offload, *one_m]))
    for pair in (131072, 262144):
        out.append(dict(id=f"simpo_pair_{pair // 1024}K_offload@h100x2", group="gpu-pairs",
                        config="configs/qwen3_8b_grm_simpo.yaml", topology="h100x2", length=f"2 x {pair // 1024}K",
                        label=f"SimPO pair 2 x {pair // 1024}K, `offload_layer_inputs`",
                        sets=[*offload, "data.layout=rows", f"data.seq_len={pair}", "data.batch_rows=2",
                              "grad_accum=1", "mesh.seq=2", "mesh.fsdp=1"]))
    for gpus, pair in ((2, 131072), (4, 131072), (4, 262144), (2, 262144)):
        out.append(dict(id=f"simpo_pair_{pair // 1024}K@h100x{gpus}", group="gpu-pairs",
                        config="configs/qwen3_8b_grm_simpo.yaml", topology=f"h100x{gpus}",
                        length=f"2 x {pair // 1024}K", label=f"SimPO pair 2 x {pair // 1024}K",
                        sets=[*tiled, "data.layout=rows", f"data.seq_len={pair}", "data.batch_rows=2",
                              "grad_accum=1", f"mesh.seq={gpus}", "mesh.fsdp=1"]))
    # One GPU, the longest pairs (issue 30): LoRA BT on a bf16 base and full-parameter SimPO with the AdamW state
    # in pinned host memory, each offloading the layer inputs and tiling the MLP (the settings measured at 2 x 64K
    # and 2 x 128K on one H100, docs/perf_training.md, "Settings by pair length").
    one_gpu = ["model.mlp_chunk_tokens=8192", "model.remat=offload_layer_inputs", "data.layout=rows",
               "data.batch_rows=2", "grad_accum=1", "mesh.seq=1", "mesh.fsdp=1"]
    for topo, pairs in (("h100x1", (131072, 163840, 196608)), ("h200x1", (196608, 262144))):
        for pair in pairs:
            k = pair // 1024
            out.append(dict(id=f"bt_lora_pair_{k}K@{topo}", group="gpu-one", config="configs/llama31_8b_disrm_bt.yaml",
                            topology=topo, length=f"2 x {k}K", label=f"Llama-3.1-8B BT LoRA r=8 (bf16 base), 2 x {k}K",
                            sets=[*one_gpu, f"data.seq_len={pair}"]))
            out.append(dict(id=f"simpo_full_pair_{k}K@{topo}", group="gpu-one",
                            config="configs/qwen3_8b_grm_simpo.yaml", topology=topo, length=f"2 x {k}K",
                            label=f"Qwen3-8B SimPO, full parameters (bf16, AdamW state on the host; the update's "
                                  f"figure is an upper bound), 2 x {k}K",
                            sets=[*one_gpu, f"data.seq_len={pair}", "model.preset=qwen3_8b",
                                  "model.param_dtype=bfloat16", "optim.offload_state=true"]))
    # The LoRA 2 x 256K pair within a 96 GiB host budget: only the first 24 of 32 layers offload
    # (model.offloaded_layers), the other 8 layers' inputs stay on the H200.
    out.append(dict(id="bt_lora_pair_256K_offloaded24@h200x1", group="gpu-one",
                    config="configs/llama31_8b_disrm_bt.yaml", topology="h200x1", length="2 x 256K",
                    label="Llama-3.1-8B BT LoRA r=8 (bf16 base), 2 x 256K, 24 of 32 layers offloaded",
                    sets=[*one_gpu, "data.seq_len=262144", "model.offloaded_layers=24",
                          "host_memory_budget_gib=96"]))
    return out


def command(row: dict) -> list[str]:
    cmd = [sys.executable, "-m", "longrm_jax.train", "--config", row["config"], "--compile-only",
           "--topology", row["topology"]]
    for s in row["sets"]:
        cmd += ["--set", s]
    return cmd


def parse(stdout: str, stderr: str, rc: int) -> dict:
    """The figures of one ``--compile-only`` output."""
    r: dict = {"rc": rc}
    if m := re.search(r"peak ([\d.]+) GiB of ([\d.]+) GiB HBM", stdout):
        r.update(peak_gib=float(m.group(1)), hbm_gib=float(m.group(2)), fits=True)
    if m := re.search(r"predicted (at least )?([\d.]+) GiB per device.*?, available ([\d.]+) GiB", stdout + stderr):
        r.update(peak_gib=float(m.group(2)), hbm_gib=float(m.group(3)), fits=False, lower_bound=bool(m.group(1)))
    if m := re.search(r"^model\.remat=([^\s,]+)", stdout, re.M):
        r["remat"] = m.group(1)
    if m := re.search(r"step time at (\d+)% MFU: ([\d.e+-]+) s", stdout):
        r.update(mfu_pct=int(m.group(1)), step_s=float(m.group(2)))
    if m := re.search(r"^gradients program: (.*)$", stdout, re.M):
        r["gradients_program"] = m.group(1)
    if m := re.search(r"(\d+) Mosaic TPU", r.get("gradients_program", "")):
        r["mosaic_tpu"] = int(m.group(1))
    if "fits" not in r:
        r["error"] = (stderr.strip().splitlines() or ["no output"])[-1][:300]
    return r


def run_row(row: dict) -> dict:
    t0 = time.time()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(command(row), cwd=ROOT, capture_output=True, text=True, env=env)
    result = parse(proc.stdout, proc.stderr, proc.returncode)
    result.update(command="python -m longrm_jax.train " + " ".join(command(row)[3:]),
                  compile_s=round(time.time() - t0, 1), output=proc.stdout.strip().splitlines())
    return result


def load() -> dict:
    if os.path.exists(RESULTS):
        with open(RESULTS, encoding="utf-8") as f:
            return json.load(f)
    return {}


def save(results: dict) -> None:
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    tmp = RESULTS + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    os.replace(tmp, RESULTS)


def _cell(r: dict | None) -> str:
    if not r:
        return "not compiled"
    if "peak_gib" not in r:
        return f"failed: {r.get('error', '?')}"
    if not r.get("fits"):
        return f"no: {'at least ' if r.get('lower_bound') else ''}{r['peak_gib']:.1f} > {r['hbm_gib']:.1f} GiB"
    step = f", {r['step_s']:.1f} s" if "step_s" in r else ""
    found = re.search(r"pinned host ([\d.]+) GiB", "\n".join(r.get("output", [])))
    host_gib = float(found.group(1)) if found else 0.0
    host = (f" + {host_gib:.0f} GiB pinned host" + (" (over the default 96 GiB host budget)" if host_gib > 96 else "")
            if found else "")
    # Near its budget a GPU step's own plan on the GPUs has come out above the compile (docs/compile_only.md); the
    # budget is the one the compile checked, from its output.
    budget = re.search(r"device budget per chip ([\d.]+) GiB", "\n".join(r.get("output", [])))
    gpu = re.search(r"--topology h[12]00x", r.get("command", ""))
    close = (" (close: the run's plan on the GPUs decides)"
             if gpu and budget and float(budget.group(1)) - r["peak_gib"] < GPU_COMPILE_MARGIN_GIB else "")
    return f"{r['peak_gib']:.1f} GiB{host}{close}{step}"


def markdown(results: dict) -> str:
    lines = ["**TPU pods, compiled, not run** (`python scripts/compile_table.py`): peak GiB per chip from the "
             "compiled step's memory analysis (HBM: v5p 95 GiB, v6e 32 GiB; \"no\": over it) and the step time "
             "implied at 40% MFU (bf16 peak per chip: v5p 459, v6e 918 TFLOP/s) for 8 rows of 131,072 tokens; "
             "remat `full`, splash attention inside the ring over `mesh.seq`.", "",
             "| config (128K-token rows) | " + " | ".join(
                 t for t in ("v5p-64", "v5p-8", "v6e-8", "v6e-16")) + " |",
             "|---|" + "---|" * 4]
    mesh_note = {"v5p-64": "fsdp 4 x seq 8", "v5p-8": "seq 4", "v6e-8": "seq 8", "v6e-16": "fsdp 2 x seq 8"}
    for config, label in CONFIG_LABELS.items():
        name = os.path.basename(config).removesuffix(".yaml")
        cells = [_cell(results.get(f"{name}@{t}")) for t in mesh_note]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| mesh | " + " | ".join(mesh_note.values()) + " |")
    refused = [(row, results[row["id"]]) for row in rows() if row["group"] == "tpu-oversized" and row["id"] in results]
    if refused:
        lines += ["", "Refused (exit 4, the memory plan's message; the 1M request before compiling, from a lower "
                  "bound):"]
        lines += [f"- {row['label']}: {_cell(r)}." for row, r in refused]
    lines += ["", "**GPU meshes, compiled, not run** (Qwen3-8B shapes, bf16 weights and AdamW state, remat `full`, "
              "ring attention over all GPUs (`mesh.seq`) with `pallas` blocks, the MLP in 8,192-token tiles "
              "(`model.mlp_chunk_tokens`) where not said otherwise; peak GiB per GPU against the device budget a run "
              "leaves its programs, H100 71.2 and H200 130.0 GiB (95% of 79.1 / 141 GiB HBM less 4 GiB of cuDNN "
              "workspace; docs/compile_only.md); step time at 40% MFU of 989 TFLOP/s per GPU):", "",
              "| setup | GPUs | peak per GPU, step time |", "|---|---|---|"]
    for row in rows():
        if row["group"] in ("gpu", "gpu-pairs"):
            lines.append(f"| {row['label']} | {row['topology']} | {_cell(results.get(row['id']))} |")
    one = [row for row in rows() if row["group"] == "gpu-one"]
    lines += ["", "**One GPU, longest pairs, compiled, not run** (remat `offload_layer_inputs`, MLP in 8,192-token "
              "tiles; peak GiB on the device + pinned host GiB; the default host budget is 96 GiB "
              "(`host_memory_budget_gib`); checked against the same device budgets, H100 71.2 and H200 130.0 GiB):",
              "", "| setup | GPU | peak, step time at 40% MFU |", "|---|---|---|"]
    lines += [f"| {row['label']} | {row['topology']} | {_cell(results.get(row['id']))} |" for row in one]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=None, help="rows whose id or group contains this text")
    p.add_argument("--ids", default=None, help="comma-separated row ids, compiled in this order")
    p.add_argument("--jobs", type=int, default=2, help="compiles at a time (default 2)")
    p.add_argument("--force", action="store_true", help="compile rows already in the results again")
    p.add_argument("--markdown", action="store_true", help="print the tables from the stored results only")
    p.add_argument("--write", action="store_true",
                   help="also put the tables into docs/compile_only.md, between its "
                        "'<!-- compile_table:begin -->' and '<!-- compile_table:end -->' lines")
    args = p.parse_args(argv)
    results = load()
    if not args.markdown:
        todo = [r for r in rows() if (args.only is None or args.only in r["id"] or args.only in r["group"])
                and (args.force or r["id"] not in results)]
        if args.ids:
            order = args.ids.split(",")
            unknown = set(order) - {r["id"] for r in rows()}
            if unknown:
                p.error(f"--ids: unknown row ids {sorted(unknown)}")
            todo = sorted((r for r in todo if r["id"] in order), key=lambda r: order.index(r["id"]))
        with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {pool.submit(run_row, r): r for r in todo}
            for fut in cf.as_completed(futures):
                row = futures[fut]
                results = load() | {row["id"]: fut.result()}
                save(results)
                print(f"{row['id']}: {_cell(results[row['id']])} ({results[row['id']]['compile_s']} s)", flush=True)
    text = markdown(results)
    print(text)
    if args.write:
        write_between_markers(os.path.join(ROOT, "docs", "compile_only.md"), text)
    return 0


def write_between_markers(path: str, text: str) -> None:
    begin, end = "<!-- compile_table:begin -->", "<!-- compile_table:end -->"
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path}: no {begin} ... {end} lines to write the tables between")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{begin}\n{text}\n{end}{tail}")


if __name__ == "__main__":
    sys.exit(main())
