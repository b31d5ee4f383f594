"""The evaluator's settings: one schema (``EvalConfig``) that ``python -m longrm_jax.evaluate`` reads from
``--config FILE``, ``--set KEY=VALUE`` and one flag per key (``longrm_jax.schema_flags``), that the Python API and
training's held-out judging build directly, and that a replica process receives as a file.

Each field's comment is its flag's help; its range or choices are declared beside it (``config_rules``) and
checked by ``validate``, whichever way the value came. ``check_paths`` checks what the settings name on disk."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import ClassVar

from longrm_jax.cli_support import InputError
from longrm_jax.compile_cache import AUTO, OFF
from longrm_jax.config_rules import RULE, ConfigError, choice, out_of_range, ranged
from longrm_jax.evaluation.encoding import UPSTREAM_MAX_LENGTH
from longrm_jax.evaluation.samples import DEFAULT_SEED
from longrm_jax.parallel.mesh import MESH_AXES

# A GRM's judgement budget when max_new_tokens is not set (upstream's eval.py), for a run and its compile.
DEFAULT_MAX_NEW_TOKENS = 2048
DTYPES = ("auto", "bfloat16", "float32", "float16")
TASK_TYPES = ("PairWise", "BestOfN")
MAX_COUNT = 2**31 - 1  # counts reach jitted programs as 32-bit integers


@dataclass
class EvalConfig:
    """One evaluation run: what is judged, how, on which devices."""

    # Local Hugging Face checkpoint directory (config.json, safetensors, tokenizer); with --compile-only also a
    # directory with only config.json, or a preset name (qwen3_8b, llama31_8b, mistral_7b, mistral_nemo_12b,
    # qwen25_7b, gemma3_1b, gemma3_12b).
    model_path: str | None = None
    # Directory holding {Task}.jsonl files (or one .jsonl file): the benchmark data (required unless
    # --compile-only).
    data_path: str | None = None
    # Discriminative RM (sequence classifier): score each answer with the reward head instead of generating a
    # judgement.
    is_disrm: bool = False
    save_path: str | None = None  # output directory (default: results/<model directory name>)
    # Task files to evaluate (default: LongQA Summ Safety ICL Cite Code Math where present, else every *.jsonl in
    # --data-path).
    tasks: list[str] | None = None
    # Long-RewardBench: evaluate only these sample types, PairWise and/or BestOfN (default: both).
    task_types: list[str] | None = None
    # GRM on Long-form RewardBench records: upstream (the benchmark's own protocol exactly: each response judged
    # alone by its raw-text prompt, no chat template, the first strict '**Result:** x.y' is the score, an unparsed
    # score makes the sample wrong and leaves its pairs out of binary accuracy), pointwise (ours: each response
    # alone through the chat template, lenient parser, an unparsed score loses) or joint (all answers ranked in one
    # prompt).
    longform_protocol: str = choice("upstream", ("upstream", "pointwise", "joint"))
    # Jinja chat template file used instead of the tokenizer's (for tokenizers that have none).
    chat_template: str | None = None
    # Middle truncation: a sequence of this many tokens or more keeps its first max/2 and last max/2-5 tokens (the
    # default is upstream's; null: judge whole, as --no-truncate).
    max_length: int | None = ranged(UPSTREAM_MAX_LENGTH, ">= 16")
    # Truncate in the middle at --max-length; --no-truncate judges contexts whole (pair it with --mesh seq=N so the
    # prefill is split over devices).
    truncate: bool = True
    seed: int = DEFAULT_SEED  # seed of the per-task answer permutation (the default is upstream's)
    # Compute dtype. auto: DisRM scores in the checkpoint's dtype (config.json torch_dtype; bfloat16 rounds close
    # reward scores into ties and flips); a GRM generates in bfloat16. float16 is what upstream scores in.
    dtype: str = choice("auto", DTYPES, one_of=True)
    # Also judge the swapped order (pairwise) / every cyclic rotation (Best-of-N) and report position-bias
    # agreement in results.json.
    both_orders: bool = False
    limit: int | None = ranged(None, ">= 1")  # evaluate at most N samples per task file

    # GRM: generation budget per judgement, greedy (unset: 2048; Long-form records under the upstream protocol:
    # 1024, as the benchmark's script).
    max_new_tokens: int | None = ranged(None, ">= 1")
    # DisRM and static GRM batches: maximum rows per model call, reduced for long buckets by --max-batch-tokens
    # (unset: 4). GRM continuous batching: the number of slots (unset: as many as the device's memory holds next
    # to the weights, logged).
    batch_size: int | None = ranged(None, ">= 1")
    # DisRM and static GRM batches: cap on rows x padded length per call; GRM counts prompt + --max-new-tokens.
    max_batch_tokens: int = ranged(131_072, ">= 1")
    # GRM: static length-bucket batches, each decoded until its last row is done, instead of continuous batching
    # (a finished row refilled with the next prompt; one device only: a multi-device mesh always runs static
    # batches).
    static_batches: bool = False
    # GRM: run: the judge prompts of every task file in one generation queue (slots fill with prompts of every task
    # at each length); per-task: one queue per task file (the same predictions).
    queue: str = choice("run", ("run", "per-task"))
    # GRM continuous batching: decode steps per host round trip (a call returns early when a row finishes and
    # prompts wait).
    decode_chunk: int = ranged(16, ">= 1")
    # GRM: attention of a decode step over the KV cache. pallas: a Triton kernel that reads the cache in place
    # (GPU, one device); xla: two batched matmuls (any backend and mesh). auto: pallas on one GPU, else xla.
    decode_attention: str = choice("auto", ("auto", "xla", "pallas"))
    # GRM with the pallas decode attention: unroll the layer loop of a decode step (about 5% faster per token,
    # about 8 s more compile per decode program). auto: on when the run's token budget (samples x
    # --max-new-tokens) is large enough to pay for the compiles.
    unroll_decode_layers: str = choice("auto", ("auto", "on", "off"))
    # GRM continuous batching: memory to size the slot pool by, in GiB, instead of the device's reported limit
    # (memory_stats bytes_limit).
    device_memory_gib: float | None = ranged(None, "> 0")
    # Benchmarking random-weight models only: end each judgement after a deterministic per-prompt number of tokens
    # drawn like real judgement lengths (a random model never writes EOS; see
    # longrm_jax.evaluation.grm.simulated_lengths). The verdicts are then meaningless.
    simulate_judgement_lengths: bool = False
    # DisRM: compute each sample's shared prompt once and score only the answers on top of its KV cache (same
    # scores, 2-4x fewer FLOPs; single device).
    share_prompt: bool = False
    # GRM on a GPU: append the GPU decode XLA flags (longrm_jax.xla_flags.GPU_DECODE_XLA_FLAGS: cuBLAS matmuls
    # read each scanned layer's weights in place) to XLA_FLAGS at startup; never for --is-disrm (they slow its
    # prefill) nor on the CPU; flags already in XLA_FLAGS are kept. --no-gpu-flags: leave XLA_FLAGS as it is.
    gpu_flags: bool = True

    # Device mesh, e.g. data=1,fsdp=8 or fsdp=2,seq=4 (seq > 1: ring attention over the sequence); in a file, a
    # mapping ({fsdp: 2, seq: 4}). Unset: one device; with --compile-only, fsdp over every chip of the topology.
    mesh: dict | str | None = None
    # auto or a count N: one evaluation process per GPU, each judging a share of the samples (shared out by
    # predicted cost) with the weights replicated, the results merged as one run's. auto: one per visible GPU when
    # there are several, no --mesh is given and the weights leave room for a cache on one GPU; 1: one process; N:
    # the first N GPUs (on a host without GPUs, N CPU processes). Logs under SAVE_PATH/replicas/rI/.
    replicas: str = "auto"
    # With replicas: samples of more than N tokens (estimated from their characters) go to no replica but are
    # judged after them by one program over a seq mesh of the replicas' GPUs (ring-attention prefill). Unset:
    # those whose cache and prefill would not fit one GPU beside the weights.
    replica_max_tokens: int | None = ranged(None, ">= 1")
    # A replica's share: the file:row places of the samples it judges (evaluation.replicas writes it).
    only_samples: list[str] | None = None

    # Persistent XLA compilation cache: auto ($JAX_COMPILATION_CACHE_DIR, else ~/.cache/longrm_jax/xla), off, or a
    # directory: later runs reuse the compiled bucket shapes instead of recompiling them.
    compilation_cache: str = AUTO
    # Reuse the predictions of task files a previous run with the same settings finished (saved under
    # SAVE_PATH/partial as each task file completes), and of the GRM samples it finished in files it did not
    # (journaled there as each sample completes).
    resume: bool = False
    # Replace the results of an earlier evaluation in --save-path (without it, and without --resume, such a save
    # path is refused).
    overwrite: bool = False
    # Exit 0 even when no GRM judgement holds a parsable verdict (speed runs on random weights); without it such a
    # run exits 3, its outputs written all the same.
    allow_no_verdicts: bool = False
    progress: bool = True  # progress bars (they show only on a terminal anyway)
    # Stop instead of warning when a slower fallback would run (a broken tokamax import, a failed memory_stats()
    # shrinking the GRM slot pool, ...).
    strict_kernels: bool = False

    # Compile the evaluator's programs (DisRM: scoring; GRM: prefill and decode) at --compile-length tokens x
    # --batch-size rows (1 when unset) for --topology without data, weights or accelerator, print memory per chip,
    # FLOPs, kernels and collectives, and exit (non-zero when it does not fit).
    compile_only: bool = False
    topology: str | None = None  # with --compile-only: a TPU slice (v5p-8, v6e-16) or GPU hosts (h100x8, h200x1)
    topology_slices: int = ranged(1, ">= 1")  # TPU multislice: N slices
    # With --compile-only: prompt length to compile for (unset: --max-length).
    compile_length: int | None = ranged(None, ">= 1")

    # The flags' groups in --help, in order (a field in none is listed under the first).
    FLAG_GROUPS: ClassVar[dict[str, str]] = {
        "model and data": "model_path", "generation and scoring": "max_new_tokens", "devices": "mesh",
        "the run": "compilation_cache", "compile only": "compile_only"}
    # Set by a replica's parent, not by users: no flag in --help.
    HIDDEN: ClassVar[tuple[str, ...]] = ("only_samples",)
    METAVARS: ClassVar[dict[str, str]] = {
        "model_path": "DIR", "data_path": "PATH", "save_path": "DIR", "tasks": "TASK", "task_types": "TYPE",
        "chat_template": "FILE", "mesh": "AXIS=SIZE,...", "replicas": "auto|N", "compilation_cache": "auto|off|DIR",
        "topology": "NAME", "compile_length": "TOKENS"}
    REQUIRED: ClassVar[dict[str, str]] = {"model_path": "DIR, a local Hugging Face checkpoint directory"}

    def validate(self) -> "EvalConfig":
        """Check every declared range and choice, the list and mesh settings and what goes together; a ConfigError
        names the key. ``--no-truncate`` (``truncate: false``) clears ``max_length``."""
        problem = out_of_range(self)
        if problem:
            raise ConfigError(problem)
        for key, what in self.REQUIRED.items():
            if not getattr(self, key):
                raise ConfigError(f"{key}: required (--{key.replace('_', '-')} {what})")
        for name, value in (("tasks", self.tasks), ("task_types", self.task_types),
                            ("only_samples", self.only_samples)):
            if value is not None and (not value or not all(isinstance(v, str) and v for v in value)):
                raise ConfigError(f"{name} must be a non-empty list of names; got {value!r}")
        unknown = sorted(set(self.task_types or ()) - set(TASK_TYPES))
        if unknown:
            raise ConfigError(f"task_types must name {' or '.join(TASK_TYPES)}; got {', '.join(unknown)}")
        for name in ("max_length", "limit", "max_new_tokens", "batch_size", "max_batch_tokens", "decode_chunk",
                     "replica_max_tokens"):
            value = getattr(self, name)
            if value is not None and value > MAX_COUNT:
                raise ConfigError(f"{name} must be at most {MAX_COUNT:,}; got {value}")
        self.mesh = mesh_problem(self.mesh)
        if not (self.replicas == "auto" or (str(self.replicas).isdigit() and int(self.replicas) >= 1)):
            raise ConfigError(f"replicas must be auto or a count >= 1; got {self.replicas!r}")
        self.replicas = str(self.replicas)
        if bool(self.topology) != self.compile_only:
            raise ConfigError("--compile-only and --topology go together (e.g. --compile-only --topology v5p-8)")
        if not self.compile_only and not self.data_path:
            raise ConfigError("data_path: required (--data-path DIR, the benchmark's task files)")
        if not self.truncate:
            self.max_length = None
        return self

    @property
    def judgement_budget(self) -> int:
        """A GRM judgement's token budget: ``max_new_tokens``, else upstream's 2,048."""
        return self.max_new_tokens or DEFAULT_MAX_NEW_TOKENS

    def resolved_save_path(self) -> str:
        if self.save_path:
            return self.save_path
        return os.path.join("results", os.path.basename(os.path.normpath(self.model_path)))

    def to_dict(self) -> dict:
        """Every setting by name: what ``--config FILE`` reads back to this config."""
        return dataclasses.asdict(self)


def parse_mesh(text: str) -> dict[str, int]:
    """``"data=1,fsdp=4,seq=2"`` -> {"data": 1, "fsdp": 4, "seq": 2}; unnamed axes default to 1, except
    ``fsdp``, which takes the devices left over (``make_mesh``'s -1)."""
    mesh = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in MESH_AXES or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"bad entry {part!r}; expected comma-separated AXIS=SIZE with AXIS in {MESH_AXES}")
        mesh[name] = int(value)
    return mesh


def mesh_problem(mesh) -> dict[str, int] | None:
    """``mesh`` as a mapping of axis sizes (a string is read by :func:`parse_mesh`), or a ConfigError."""
    if mesh is None:
        return None
    if isinstance(mesh, str):
        try:
            mesh = parse_mesh(mesh)
        except ValueError as error:
            raise ConfigError(f"mesh {mesh!r}: {error}") from None
    for axis, size in mesh.items():
        if axis not in MESH_AXES:
            raise ConfigError(f"mesh: unknown axis {axis!r}; axes: {', '.join(MESH_AXES)}")
        if isinstance(size, bool) or not isinstance(size, int):
            raise ConfigError(f"mesh {axis}={size!r}: sizes are integers")
        if size < 1 and not (axis == "fsdp" and size == -1):
            raise ConfigError(f"mesh {axis}={size}: sizes must be >= 1 (fsdp=-1: the devices left over)")
    return dict(mesh)


def setting_problem(name: str, value) -> str | None:
    """What is wrong with ``value`` for the setting ``name`` by its declared rule, as the end of an error message
    ("must be >= 16; got 0"); None when it is fine (None is fine where the setting may be unset). The Python API
    checks its arguments with it."""
    field = next(f for f in dataclasses.fields(EvalConfig) if f.name == name)
    if value is None:
        return None
    rule = field.metadata.get(RULE)
    if rule is None:
        return None
    if not isinstance(value, str) and isinstance(value, (int, float)) and not isinstance(value, bool):
        if value > MAX_COUNT:
            return f"must be at most {MAX_COUNT:,}; got {value}"
    return None if rule.ok(value) else f"must be {rule.want}; got {value!r}"


def check_paths(cfg: EvalConfig) -> None:
    """Refuse paths that would fail later, before any model, data or backend is touched: the model and data
    exist, the chat template is a file, the save path and compilation cache can be directories."""
    if not os.path.isdir(cfg.model_path):
        raise InputError(f"--model-path {cfg.model_path}: not a directory (a local Hugging Face checkpoint "
                         "directory is needed)")
    if not os.path.exists(cfg.data_path):
        raise InputError(f"--data-path {cfg.data_path} does not exist")
    if cfg.chat_template is not None and not os.path.isfile(cfg.chat_template):
        raise InputError(f"--chat-template {cfg.chat_template}: no such file")
    cache = None if cfg.compilation_cache in (AUTO, OFF) else cfg.compilation_cache
    for flag, path in (("--save-path", cfg.save_path), ("--compilation-cache", cache)):
        if path is not None:
            _check_writable_dir(flag, path)


def _check_writable_dir(flag: str, path: str) -> None:
    """``path`` is (or can be created as) a directory: neither it nor an existing parent is a file."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        where = "is a file" if probe == os.path.abspath(path) else f"is under {probe}, which is a file"
        raise InputError(f"{flag} {path} {where}; a directory is needed")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{flag} {path}: {probe} is not writable")

