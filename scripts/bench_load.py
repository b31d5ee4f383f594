"""Benchmark ``load_pretrained`` on an 8B-shaped checkpoint: load time and device peak memory vs weight bytes.

    python scripts/bench_load.py                 # Llama-3.1-8B shapes, random bf16, written to --work-dir
    python scripts/bench_load.py --family qwen3  # Qwen3-8B shapes
    python scripts/bench_load.py --model-path DIR
    python scripts/bench_load.py --smoke               # CPU smoke test (tiny shapes)

Acceptance (issue 2): device peak <= 1.1 x the weights' bytes when loading onto one device (mesh of 1).
The synthetic checkpoint is written like HF's (5 GB safetensors shards + index), streaming one tensor at a
time so host memory stays small; it is reused on later runs when its config matches.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import struct
import sys
import time

import numpy as np

import _bench

SHAPES = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=4096,
                  intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False,
                  rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=4096,
                  intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                  head_dim=128, rms_norm_eps=1e-6, max_position_embeddings=40960, tie_word_embeddings=False,
                  rope_theta=1000000.0, rope_scaling=None),
}
TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32)


def hf_tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of a Llama / Qwen3 causal LM (the layout real checkpoints have)."""
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    shapes = {"model.embed_tokens.weight": (v, d)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,), p + "self_attn.q_proj.weight": (q, d),
            p + "self_attn.k_proj.weight": (kv, d), p + "self_attn.v_proj.weight": (kv, d),
            p + "self_attn.o_proj.weight": (d, q), p + "post_attention_layernorm.weight": (d,),
            p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
        })
        if cfg["model_type"] == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (cfg["head_dim"],)
            shapes[p + "self_attn.k_norm.weight"] = (cfg["head_dim"],)
    shapes["model.norm.weight"] = (d,)
    if not cfg.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = (v, d)
    return shapes


def write_synthetic_checkpoint(out_dir: str, cfg: dict, max_shard_bytes: int = 5 * 10**9) -> int:
    """Random bf16 checkpoint, HF-sharded, streamed tensor by tensor. Returns total bytes.

    Written by hand rather than with ``safetensors.numpy.save_file``: the library needs every tensor of a shard in
    memory at once (5 GB of random bf16), while this writes the header and then streams one tensor at a time."""
    import ml_dtypes
    from tqdm import tqdm

    os.makedirs(out_dir, exist_ok=True)
    shapes = hf_tensor_shapes(cfg)
    itemsize = 2
    shards, current, size = [], [], 0
    for name, shape in shapes.items():
        nbytes = int(np.prod(shape)) * itemsize
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    shards.append(current)
    # One random pool, reused cyclically: random enough for a load benchmark, fast to produce.
    pool = (np.random.default_rng(0).standard_normal(1 << 22, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)
    weight_map, total = {}, 0
    bar = tqdm(total=sum(int(np.prod(s)) * itemsize for s in shapes.values()), unit="B", unit_scale=True,
               desc="writing synthetic checkpoint")
    for k, names in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name in names:
            n = int(np.prod(shapes[name])) * itemsize
            header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = fname
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        with open(os.path.join(out_dir, fname), "wb") as fh:
            fh.write(struct.pack("<Q", len(blob)))
            fh.write(blob)
            for name in names:
                count = int(np.prod(shapes[name]))
                if "norm" in name:
                    fh.write(np.ones(count, ml_dtypes.bfloat16).tobytes())
                else:
                    for start in range(0, count, pool.size):
                        fh.write(pool[: min(pool.size, count - start)].tobytes())
                bar.update(count * itemsize)
        total += offset
    bar.close()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh)
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(dict(cfg, torch_dtype="bfloat16", hidden_act="silu", bos_token_id=1, eos_token_id=2), fh)
    return total


def ensure_checkpoint(work_dir: str, cfg: dict) -> str:
    marker = os.path.join(work_dir, "config.json")
    if os.path.isfile(marker) and os.path.isfile(os.path.join(work_dir, "model.safetensors.index.json")):
        with open(marker) as fh:
            existing = json.load(fh)
        if all(existing.get(k) == v for k, v in cfg.items()):
            print(f"reusing synthetic checkpoint in {work_dir}")
            return work_dir
    write_synthetic_checkpoint(work_dir, cfg)
    return work_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=sorted(SHAPES), default="llama", help="8B shapes to synthesise")
    parser.add_argument("--model-path", help="benchmark this existing HF checkpoint instead")
    parser.add_argument("--work-dir", default="/tmp/longrm_bench_load", help="where the synthetic checkpoint goes")
    parser.add_argument("--dtype", default=None, help="param dtype to load as (default: the checkpoint's)")
    _bench.add_common_flags(parser, iters=None, warmup=None, smoke_help="tiny shapes on the CPU (smoke test)")
    args = parser.parse_args(argv)

    import jax

    from longrm_jax import load_pretrained
    from longrm_jax.parallel.mesh import make_mesh

    if args.model_path:
        path, label = args.model_path, os.path.basename(os.path.normpath(args.model_path))
    else:
        cfg = dict(SHAPES[args.family], **(TINY if args.smoke else {}))
        label = f"{'tiny ' if args.smoke else ''}{args.family} {'8B-shaped' if not args.smoke else ''}".strip()
        path = ensure_checkpoint(args.work_dir + ("_tiny" if args.smoke else "") + f"_{args.family}", cfg)

    device = jax.devices()[0]
    mesh = make_mesh(fsdp=1, devices=[device])
    t0 = time.perf_counter()
    model = load_pretrained(path, mesh=mesh, param_dtype=args.dtype)
    leaves = jax.tree.leaves(model)
    jax.block_until_ready(leaves)
    seconds = time.perf_counter() - t0
    weight_bytes = sum(x.nbytes for x in leaves if hasattr(x, "nbytes"))
    stats = device.memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    ratio = peak / weight_bytes if peak else float("nan")
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    gib = 2**30
    rows = [
        ("checkpoint", label), ("device", _bench.device_name(device)),
        ("parameters", f"{sum(x.size for x in leaves if hasattr(x, 'size')) / 1e9:.3f} B"),
        ("weights", f"{weight_bytes / gib:.2f} GiB"), ("load time", f"{seconds:.1f} s"),
        ("load throughput", f"{weight_bytes / gib / seconds:.2f} GiB/s"),
        ("device peak", "n/a (no memory_stats on this backend)" if not peak else f"{peak / gib:.2f} GiB"),
        ("peak / weights", "n/a" if not peak else f"{ratio:.3f} (acceptance <= 1.1: {'PASS' if ratio <= 1.1 else 'FAIL'})"),
        ("host peak RSS", f"{host_peak / gib:.2f} GiB (counts memory-mapped checkpoint pages, reclaimable)"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")

    path = _bench.record_path(args)
    if path:
        peak_gib, ratio_text = ("n/a", "n/a") if not peak else (f"{peak / gib:.2f}", f"{ratio:.3f}")
        _bench.append_section(
            path, "checkpoint load", command=_bench.command_line(argv), device=f"{_bench.device_name(device)}, "
            f"{platform.machine()}", details=f"{label}, load_pretrained onto one device (mesh of 1)",
            table=_bench.markdown_table(
                ("weights GiB", "load s", "GiB/s", "device peak GiB", "peak / weights", "host RSS GiB"),
                [(f"{weight_bytes / gib:.2f}", f"{seconds:.1f}", f"{weight_bytes / gib / seconds:.2f}", peak_gib,
                  ratio_text, f"{host_peak / gib:.2f}")], "rrrrrr"))
    return 0 if not peak or ratio <= 1.1 else 1


if __name__ == "__main__":
    sys.exit(main())
