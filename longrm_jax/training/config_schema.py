"""The training configuration's schema: the dataclass of each YAML section and ``TrainConfig.validate``'s checks.

``training.config`` loads YAML into these (every key checked, values coerced to the declared types, ``--set``
overrides) and writes them back.
"""


import dataclasses
from dataclasses import dataclass, field

from longrm_jax.cli_support import InputError
from longrm_jax.data.tokenize import RESPONSE_ENDS
from longrm_jax.models.config import REMAT_POLICIES, ModelConfig
from longrm_jax.training.mesh_config import MeshSection, mesh_problem, range_rules

# checkpoint.on_corrupt: what --resume does when its newest step cannot be read (training.checkpoint_check).
ON_CORRUPT = ("fallback", "error")


class ConfigError(InputError):
    """A configuration file or override that does not fit the schema."""


@dataclass
class ModelSection:
    # HF checkpoint directory, an orbax training checkpoint directory, or None for random init from `preset`.
    init: str | None = None
    # Named ModelConfig for random init (see training.model_setup.PRESETS), e.g. "tiny_qwen3".
    preset: str = "tiny_qwen3"
    # ModelConfig field overrides (random init and HF loading), e.g. {num_layers: 2}.
    overrides: dict = field(default_factory=dict)
    head: str = "auto"  # "causal_lm" or "classifier" (score head); "auto": classifier for stage bt
    compute_dtype: str = "float32"  # activations / matmuls; "bfloat16" on accelerators
    param_dtype: str = "float32"  # master weights and optimizer state
    # ModelConfig.remat (none, full, dots_saveable, save_attention_out, offload_layer_inputs,
    # offload_layer_inputs_and_attention) or "auto": the fastest of none, save_attention_out, full and then the
    # offloading ones whose compiled step fits the device and the host budget (training.memory_plan).
    remat: str = "none"
    # Sequence-tiled MLP: each layer's MLP on chunks of at most this many tokens (0: whole rows; ModelConfig.
    # mlp_chunk_tokens). With remat auto the plan turns it on (AUTO_MLP_CHUNK_TOKENS) where untiled nothing fits.
    mlp_chunk_tokens: int = 0
    # Under an offloading remat policy: how many layers (the first ones) save to pinned host memory; the rest keep
    # theirs on the device (ModelConfig.offloaded_layers). null: all. For a step whose offloaded activations
    # outgrow the host while the device has room. With a frozen base (LoRA) it costs nothing more; with full
    # parameters the partial layer range accumulates one more gradient-sized buffer (the plan's compile counts it).
    # remat auto sets it when every layer offloaded fits the device but not the host budget (training.memory_plan).
    offloaded_layers: int | None = None


@dataclass
class DataSection:
    source: str = "synthetic"  # "synthetic" or a dataset path the data package reads
    # Several datasets blended (replaces `source` when given): entries `{path: P, ratio: 0.5}` (that fraction of
    # its rows), `{path: P, count: 1000}` (that many) or a plain path (all rows); see data.blend.
    sources: list = field(default_factory=list)
    chat_template: str | None = None  # Jinja template file replacing (or supplying) the tokenizer's
    eval_source: str | None = None  # None: held-out synthetic pairs / the source's eval split
    tokenizer: str | None = None  # None: the bundled tiny tokenizer
    seq_len: int = 512  # tokens per row (T): a packed row, or one sequence with layout "rows"
    # "packed": groups back to back in rows of seq_len (segment ids). "rows" (preference stages): one sequence
    # per row, a group's 1 + R rows side by side, each sample cut to seq_len: attention without segment ids
    # (the fast GPU layout for long pairs: cuDNN's flash backward; packing gains nothing at 1 group per row).
    layout: str = "packed"
    # Model rows per micro step, global over the data-parallel devices; an optimizer step takes
    # batch_rows x grad_accum rows. Packed: a row of seq_len tokens holding several groups. Rows layout: one
    # sequence per row, so a preference group takes 1 + num_rejects rows (batch_rows must be a multiple).
    batch_rows: int = 8
    num_rejects: int = 1  # rejected responses per group (R), preference stages
    max_groups_per_row: int = 8  # static bound on groups (or SFT samples) per row
    # Packed rows: at most this many groups (SFT samples) per row; null: as many as fit. 1 reproduces upstream
    # SFT's one sample per micro step (docs/upstream.md "Pairs per optimizer step").
    groups_per_row: int | None = None
    num_train: int = 512  # synthetic: training samples
    num_eval: int = 128  # synthetic: held-out pairs
    synthetic: dict = field(default_factory=dict)  # extra synthetic-generator options
    shuffle: bool = True
    num_buckets: int = 1  # row lengths below seq_len (bucket_scheme): fewer padding tokens, more compiles
    bucket_multiple: int = 128  # bucket lengths round up to this (keep it a multiple of 2 x mesh.seq)
    # "halving": seq_len / 2^k; "linear": seq_len * (k + 1) / num_buckets (padding per row < seq_len / num_buckets)
    bucket_scheme: str = "halving"
    # Groups packed together by the pipeline (fuller rows vs first-batch latency and memory); null: 256 for rows
    # up to 16K tokens, fewer for longer rows (4M tokens of rows per window, data.pipeline.auto_window_groups).
    window_groups: int | None = None
    # Chat template's enable_thinking: null renders without the variable, as upstream training (Qwen3: the
    # response opens with the empty think block, which is trained); false moves that block into the masked prompt.
    enable_thinking: bool | None = None
    # Each sequence longer than its row, on its own: "prompt_middle" (the middle of the prompt goes, the response
    # stays), "right" (upstream's literal right cut, EOS forced) or "error". A pair is never cut as a whole: one
    # too long to share a row (packed layout) gets a row of its own, (1 + num_rejects) x seq_len long.
    truncation: str = "prompt_middle"
    # How a response ends: "upstream" (the template's end-of-turn token, then " " + EOS as text where EOS is
    # another token; the evaluator's DisRM score is then read one token later, after the template's newline) or
    # "template" (exactly as the chat template ends the turn: a DisRM is trained where `evaluate` reads its score;
    # data.tokenize module notes, docs/upstream.md "The DisRM score position").
    response_end: str = "upstream"
    worker_count: int = 2  # pipeline threads tokenizing / packing windows ahead


@dataclass
class LossSection:
    beta: float = 2.5  # SimPO
    gamma: float = 0.5  # SimPO, absolute margin
    label_smoothing: float = 0.0
    nll_weight: float = 0.0
    margin: float = 0.0  # Bradley-Terry
    center_rewards_coefficient: float = 0.0
    chunk_tokens: int = 8192  # tokens per chunk of the fp32 logits in response log-probs
    # SimPO loss: "sigmoid" (-log s(z), label smoothing applies) or "hinge" (relu(1 - z)), z = beta dpi - gamma.
    loss_type: str = "sigmoid"
    # "upstream": mean over each microbatch's pairs, then over microbatches (SFT: mean over the step's samples of
    # per-sample token means, as upstream's one sample per micro-step);
    # "global_tokens": one mean over the global batch's pairs (SFT: trained tokens). README "Loss reduction".
    reduction: str = "upstream"


@dataclass
class OptimSection:
    lr: float = 2e-6
    min_lr_ratio: float = 0.1
    warmup_ratio: float = 0.05
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    # Keep the AdamW moments in pinned host memory between steps (training.state.offload_optimizer_state): the
    # gradient program, where activations peak, then has their bytes free on the device (Qwen3-8B, bf16: 30.5
    # GiB); the update program copies them in, updates and copies them back over PCIe every step.
    offload_state: bool = False


@dataclass
class LoraSection:
    rank: int = 0  # 0: full fine-tuning
    alpha: float = 8.0
    # Parameter-path suffixes that get adapters; "all-linear" means every projection of the decoder.
    targets: list = field(default_factory=lambda: ["all-linear"])
    # Modules trained fully next to the adapters (peft's modules_to_save; a new score head for bt). Upstream's
    # DisRM instead lists `score` in `targets` (a rank-r adapter on the frozen head) and trains nothing fully.
    train_modules: list = field(default_factory=lambda: ["score"])
    # dtype of the frozen base weights (null: model.param_dtype). bfloat16 halves them (Llama-3.1-8B: 28 -> 14
    # GiB) and computes the same step: every layer casts its weights to the bf16 compute dtype before its matmuls
    # and the base gets no gradient or update, so an fp32 copy only matters for a base that is not bf16-exact
    # (HF's 8B checkpoints are stored in bf16) and for the merge at export, which then adds the fp32 adapter
    # delta to a bf16 weight (the exported weights are bf16 either way).
    base_dtype: str | None = None


@dataclass
class CheckpointSection:
    dir: str | None = None  # None: <output_dir>/checkpoints
    every: int = 0  # save every N steps (0: only at the end)
    at_end: bool = True  # save the final step (benchmarks turn it off)
    keep: int = 3
    # Write a save while the next steps run (true) or before they start (false). null: asynchronous unless the
    # step keeps pinned host memory (offloaded activations or optimizer state): an asynchronous save holds a host
    # copy of the whole state beside the running step's pinned buffers, which killed an 8B full-parameter run
    # with its moments on the host of a 128 GB H100 machine (docs/perf_training.md, "Checkpoints and pinned host").
    async_save: bool | None = None
    # A fresh (not --resume) run into a directory that already holds checkpoints: replace them (true) or stop
    # with an error (false).
    overwrite: bool = False
    # A save the disk cannot hold (checked before writing; orbax keeps older steps until the new one is complete):
    # "error" stops naming the sizes; "delete_oldest" deletes kept steps, oldest first, until it fits (for disks
    # that hold one checkpoint, e.g. an 8B full-parameter state of 49 GB on a 64 GB disk).
    on_low_disk: str = "error"
    # A --resume whose newest step cannot be read: "fallback" names it, sets it aside and resumes from the newest
    # intact step (training.checkpoint_check); "error" stops (exit 2) naming it and moves nothing, for a user who
    # would rather repair or copy the step than lose the steps since the older one.
    on_corrupt: str = "fallback"
    # Host memory a save may use, in GB (None: orbax's defaults, which copy the whole state to host memory at once
    # and let up to 96 GB be in flight to the disk). Set it when the state is a large share of the host's RAM.
    save_host_gb: int | None = None


@dataclass
class ProfileSection:
    # Trace optimizer steps [start, start + steps) (1-based) with jax.profiler; 0 steps: off. The trace (an XLA
    # xplane, readable by TensorBoard's profile plugin, xprof or scripts/profile_summary.py) goes to `dir`.
    start: int = 2  # step 1 includes first-call work (autotuning, allocator growth): start after it
    steps: int = 0
    dir: str | None = None  # None: <output_dir>/profile


@dataclass
class DistributedSection:
    # "auto": initialise when a cluster environment is detected; "on": always (needs the fields or env);
    # "off": never.
    mode: str = "auto"
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


@dataclass
class TrainConfig:
    stage: str = "bt"  # "sft", "simpo" or "bt"
    seed: int = 0
    output_dir: str = "runs/default"
    steps: int = 0  # optimizer steps; 0: `epochs` passes over the training data
    epochs: float = 1.0
    grad_accum: int = 1  # micro steps per optimizer step, each of data.batch_rows rows
    log_every: int = 1
    eval_before: bool = True
    eval_after: bool = True
    # A progress bar (true) or a line per logged step (false); null: the bar on a terminal, lines otherwise (a bar
    # redrawn into a log file is one long line of carriage returns).
    progress: bool | None = None
    tensorboard: bool = True
    # Before loading weights the trainer compiles the step and stops if its predicted memory exceeds the
    # device's (training.memory_plan). Per-device budget in GiB; None: the device allocator's limit (CPU: 90% of the
    # host's free RAM over its CPU devices, training.host_memory).
    memory_check: bool = True
    memory_budget_gib: float | None = None
    # Pinned host memory per device for offloaded activations (model.remat offload_*), in GiB; None: 75% of the
    # host's RAM over this process's devices.
    host_memory_budget_gib: float | None = None
    # Persistent XLA compilation cache directory (None: off). A resumed or repeated run with the same shapes
    # reuses the compiled step programs instead of compiling them again (minutes for an 8B model at 128K).
    compilation_cache: str | None = None
    # A slower fallback kernel or plan (ops.slow_paths: a broken tokamax import, a cuDNN too old for the packed
    # backward, ...) stops the run instead of a warning (the train CLI's --strict-kernels sets it too).
    strict_kernels: bool = False
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    loss: LossSection = field(default_factory=LossSection)
    optim: OptimSection = field(default_factory=OptimSection)
    lora: LoraSection = field(default_factory=LoraSection)
    mesh: MeshSection = field(default_factory=MeshSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    profile: ProfileSection = field(default_factory=ProfileSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)

    def validate(self) -> "TrainConfig":
        self._check_ranges()
        if self.stage not in ("sft", "simpo", "bt"):
            raise ConfigError(f"stage must be one of sft, simpo, bt; got {self.stage!r}")
        group_rows = 1 + self.data.num_rejects
        if self.data.layout == "rows" and self.stage != "sft" and self.data.batch_rows % group_rows:
            raise ConfigError(
                f"data.batch_rows ({self.data.batch_rows}) must be a multiple of 1 + data.num_rejects "
                f"({group_rows}) with data.layout rows: each sequence of a preference group takes a row")

        if self.model.remat not in (*REMAT_POLICIES, "auto"):
            raise ConfigError(f"model.remat must be one of {', '.join((*REMAT_POLICIES, 'auto'))}; "
                              f"got {self.model.remat!r}")
        if self.model.head not in ("auto", "causal_lm", "classifier"):
            raise ConfigError(f"model.head must be auto, causal_lm or classifier; got {self.model.head!r}")
        if self.stage == "bt" and self.model.head == "causal_lm":
            raise ConfigError("stage bt needs a score head (model.head: classifier or auto)")
        if self.stage != "bt" and self.model.head == "classifier":
            raise ConfigError(f"stage {self.stage} needs an LM head (model.head: causal_lm or auto)")
        if self.data.response_end not in RESPONSE_ENDS:
            raise ConfigError(f"data.response_end must be one of {', '.join(RESPONSE_ENDS)}; "
                              f"got {self.data.response_end!r}")
        if self.data.bucket_scheme not in ("halving", "linear"):
            raise ConfigError(f"data.bucket_scheme must be halving or linear; got {self.data.bucket_scheme!r}")
        if self.data.layout not in ("packed", "rows"):
            raise ConfigError(f"data.layout must be packed or rows; got {self.data.layout!r}")
        if self.data.layout == "rows" and self.stage == "sft":
            raise ConfigError("data.layout rows is for preference stages (simpo, bt); sft packs samples")
        problem = mesh_problem(self.mesh, self.data.seq_len)
        if problem:
            raise ConfigError(problem)
        if self.checkpoint.on_low_disk not in ("error", "delete_oldest"):
            raise ConfigError(f"checkpoint.on_low_disk must be error or delete_oldest; got "
                              f"{self.checkpoint.on_low_disk!r}")
        if self.checkpoint.on_corrupt not in ON_CORRUPT:
            raise ConfigError(f"checkpoint.on_corrupt must be fallback or error; got {self.checkpoint.on_corrupt!r}")
        if self.distributed.mode not in ("auto", "on", "off"):
            raise ConfigError(f"distributed.mode must be auto, on or off; got {self.distributed.mode!r}")
        if self.stage != "sft" and self.data.num_rejects < 1:
            raise ConfigError(f"data.num_rejects must be >= 1 for stage {self.stage} (each preference group trains "
                              f"its chosen response against that many rejected ones); got {self.data.num_rejects}")
        _check_synthetic_options(self.data.synthetic)
        _check_model_overrides(self.model.overrides)
        return self

    def _check_ranges(self) -> None:
        """Numbers outside their meaningful range (a negative step count, learning rate, ...) would run and
        train nothing or crash deep inside; stop here naming the key."""
        d, o = self.data, self.optim
        rules = [
            ("steps", self.steps, self.steps >= 0, ">= 0 (0: train for `epochs`)"),
            ("epochs", self.epochs, self.epochs > 0, "> 0"),
            ("grad_accum", self.grad_accum, self.grad_accum >= 1, ">= 1"),
            ("log_every", self.log_every, self.log_every >= 1, ">= 1"),
            ("data.seq_len", d.seq_len, d.seq_len >= 1, ">= 1"),
            ("data.batch_rows", d.batch_rows, d.batch_rows >= 1, ">= 1"),
            ("data.num_rejects", d.num_rejects, d.num_rejects >= 0, ">= 0"),
            ("data.max_groups_per_row", d.max_groups_per_row, d.max_groups_per_row >= 1, ">= 1"),
            ("data.groups_per_row", d.groups_per_row, d.groups_per_row is None or d.groups_per_row >= 1,
             ">= 1 or null"),
            ("data.num_train", d.num_train, d.num_train >= 1, ">= 1"),
            ("data.num_eval", d.num_eval, d.num_eval >= 0, ">= 0"),
            ("data.num_buckets", d.num_buckets, d.num_buckets >= 1, ">= 1"),
            ("data.bucket_multiple", d.bucket_multiple, d.bucket_multiple >= 1, ">= 1"),
            ("data.window_groups", d.window_groups, d.window_groups is None or d.window_groups >= 1, ">= 1 or null"),
            ("data.worker_count", d.worker_count, d.worker_count >= 0, ">= 0"),
            ("loss.chunk_tokens", self.loss.chunk_tokens, self.loss.chunk_tokens >= 1, ">= 1"),
            # SimPO's reward scale: beta <= 0 flips (or erases) the preference, so a run would learn to prefer the
            # rejected answers. Upstream's recipes use 2.5 (and 2.0-10 in the SimPO paper).
            ("loss.beta", self.loss.beta, self.loss.beta > 0, "> 0 (it scales the reward margin; <= 0 inverts "
             "or erases the preference)"),
            ("loss.label_smoothing", self.loss.label_smoothing, 0 <= self.loss.label_smoothing < 0.5,
             "in [0, 0.5)"),
            ("loss.nll_weight", self.loss.nll_weight, self.loss.nll_weight >= 0, ">= 0"),
            ("optim.lr", o.lr, o.lr > 0, "> 0"),
            ("optim.min_lr_ratio", o.min_lr_ratio, 0 <= o.min_lr_ratio <= 1, "in [0, 1]"),
            ("optim.warmup_ratio", o.warmup_ratio, 0 <= o.warmup_ratio <= 1, "in [0, 1]"),
            ("optim.b1", o.b1, 0 <= o.b1 < 1, "in [0, 1)"),
            ("optim.b2", o.b2, 0 <= o.b2 < 1, "in [0, 1)"),
            ("optim.eps", o.eps, o.eps > 0, "> 0"),
            ("optim.weight_decay", o.weight_decay, o.weight_decay >= 0, ">= 0"),
            ("optim.grad_clip", o.grad_clip, o.grad_clip >= 0, ">= 0 (0: no clipping)"),
            ("model.mlp_chunk_tokens", self.model.mlp_chunk_tokens, self.model.mlp_chunk_tokens >= 0,
             ">= 0 (0: untiled)"),
            ("model.offloaded_layers", self.model.offloaded_layers,
             self.model.offloaded_layers is None or self.model.offloaded_layers >= 0, ">= 0 (or null: all layers)"),
            ("lora.rank", self.lora.rank, self.lora.rank >= 0, ">= 0 (0: full fine-tuning)"),
            ("lora.base_dtype", self.lora.base_dtype, self.lora.base_dtype in (None, "float32", "bfloat16"),
             "float32, bfloat16 or null (model.param_dtype)"),
            ("model.compute_dtype", self.model.compute_dtype, self.model.compute_dtype in ("float32", "bfloat16"),
             "float32 or bfloat16"),
            ("model.param_dtype", self.model.param_dtype, self.model.param_dtype in ("float32", "bfloat16"),
             "float32 or bfloat16"),
            ("checkpoint.every", self.checkpoint.every, self.checkpoint.every >= 0, ">= 0 (0: only at the end)"),
            ("checkpoint.keep", self.checkpoint.keep, self.checkpoint.keep >= 1, ">= 1"),
            ("checkpoint.save_host_gb", self.checkpoint.save_host_gb,
             self.checkpoint.save_host_gb is None or self.checkpoint.save_host_gb >= 1, ">= 1 (or unset)"),
            ("profile.start", self.profile.start, self.profile.start >= 1, ">= 1"),
            ("profile.steps", self.profile.steps, self.profile.steps >= 0, ">= 0 (0: off)"),
            ("memory_budget_gib", self.memory_budget_gib,
             self.memory_budget_gib is None or self.memory_budget_gib > 0, "> 0 (or unset)"),
            ("host_memory_budget_gib", self.host_memory_budget_gib,
             self.host_memory_budget_gib is None or self.host_memory_budget_gib > 0, "> 0 (or unset)"),
        ]
        rules += range_rules(self.mesh)
        for key, value, ok, want in rules:
            if not ok:
                raise ConfigError(f"{key} must be {want}; got {value!r}")

    @property
    def base_weights_dtype(self) -> str:
        """dtype the model's weights are created or loaded in: a LoRA run's ``lora.base_dtype`` (its frozen base;
        created in that dtype, so no fp32 copy is made and freed on the device first, which left the GPU's memory
        pool too fragmented for a step's temporaries), else ``model.param_dtype``."""
        if self.lora.rank > 0 and self.lora.base_dtype:
            return self.lora.base_dtype
        return self.model.param_dtype

    @property
    def pipeline_rows_per_step(self) -> int:
        """Rows the data pipeline yields per optimizer step: packed rows, or (rows layout) preference groups,
        each of which the trainer spreads over 1 + num_rejects model rows."""
        per_group = 1 + self.data.num_rejects if self.data.layout == "rows" and self.stage != "sft" else 1
        return self.data.batch_rows // per_group * self.grad_accum

    @property
    def head(self) -> str:
        return ("classifier" if self.stage == "bt" else "causal_lm") if self.model.head == "auto" else self.model.head

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# data.synthetic keys (options of data.synthetic.training_rows) and the check of each value.
_SYNTHETIC_OPTIONS = {
    "lengths": ("a list of positive token counts, e.g. [256, 512]",
                lambda v: isinstance(v, list) and bool(v) and all(isinstance(n, int) and not isinstance(n, bool)
                                                                   and n > 0 for n in v)),
    "num_distractors": ("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "num_values": ("an integer in [1 + data.num_rejects, 16]",
                   lambda v: isinstance(v, int) and not isinstance(v, bool) and 2 <= v <= 16),
}


# ModelConfig sizes an override may set: a count below 1 built a model without layers (or heads) that trained,
# then failed saving its zero-size arrays ("Cannot save arrays with zero size", exit 1).
_MODEL_COUNTS = ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim",
                 "vocab_size", "num_labels", "max_position_embeddings")


def _check_model_overrides(overrides: dict) -> None:
    """model.overrides is a free-form mapping of ModelConfig fields: an unknown name (a typo such as num_layer)
    is refused naming the closest field, and a size below 1 naming its key, before anything runs."""
    import difflib

    valid = [f.name for f in dataclasses.fields(ModelConfig)]
    for key, value in overrides.items():
        if key not in valid:
            close = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"did you mean {close[0]}?" if close else f"valid fields: {', '.join(sorted(valid))}"
            raise ConfigError(f"model.overrides: unknown ModelConfig field {key!r}; {hint}")
        if key in _MODEL_COUNTS and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ConfigError(f"model.overrides.{key} must be an integer >= 1; got {value!r}")


def _check_synthetic_options(options: dict) -> None:
    """data.synthetic is a free-form mapping handed to the generator: check it here, naming the key, instead of
    a TypeError deep inside the generator."""
    for key, value in options.items():
        if key not in _SYNTHETIC_OPTIONS:
            valid = ", ".join(sorted(_SYNTHETIC_OPTIONS))
            raise ConfigError(f"data.synthetic: unknown key {key!r}; valid keys: {valid}")
        want, ok = _SYNTHETIC_OPTIONS[key]
        if not ok(value):
            raise ConfigError(f"data.synthetic.{key} must be {want}; got {value!r}")
