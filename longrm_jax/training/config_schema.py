"""The training configuration's schema: the dataclass of each YAML section and ``TrainConfig.validate``'s checks.

``training.config`` loads YAML into these (every key checked, values coerced to the declared types, ``--set``
overrides) and writes them back. Each key's meaning is the comment above it (else beside it), and its range or
choices are declared with it (``config_rules``: ``ranged``, ``choice``); docs/config.md is generated
from both (``python -m longrm_jax.config_reference --write``).
"""


import dataclasses
import difflib
from dataclasses import dataclass, field

from longrm_jax.data.tokenize import RESPONSE_ENDS
from longrm_jax.models.config import MATMUL_DTYPES, REMAT_POLICIES, ModelConfig
from longrm_jax.config_rules import ConfigError, choice, out_of_range, ranged
from longrm_jax.training.mesh_config import MeshSection, mesh_problem

# checkpoint.on_corrupt: what --resume does when its newest step cannot be read (training.checkpoint_check).
ON_CORRUPT = ("fallback", "error")


@dataclass
class ModelSection:
    """The network: its initial weights, head, dtypes and rematerialisation."""

    # HF checkpoint directory, an orbax training checkpoint directory, or None for random init from `preset`.
    init: str | None = None
    # Named ModelConfig for random init (see training.model_setup.PRESETS), e.g. "tiny_qwen3".
    preset: str = "tiny_qwen3"
    # ModelConfig field overrides (random init and HF loading), e.g. {num_layers: 2}.
    overrides: dict = field(default_factory=dict)
    # "causal_lm" or "classifier" (score head); "auto": classifier for stage bt.
    head: str = choice("auto", ("auto", "causal_lm", "classifier"))
    compute_dtype: str = choice("float32", ("float32", "bfloat16"))  # activations / matmuls; bfloat16 on accelerators
    param_dtype: str = choice("float32", ("float32", "bfloat16"))  # master weights and optimizer state
    # The weights' projections (q/k/v/o, MLP; LoRA's frozen base path): "compute" (compute_dtype), "fp8" (FP8 with
    # current scaling: e4m3 forward, e5m2 gradients) or "fp8_forward" (the forward in FP8, the gradients in
    # compute_dtype); ModelConfig.matmul_dtype, ops.fp8_matmul. Attention, norms, heads, the loss and the optimizer
    # stay as they are. MFU stays counted against the bf16 peak.
    matmul_dtype: str = choice("compute", MATMUL_DTYPES)
    # ModelConfig.remat (none, full, dots_saveable, save_attention_out, offload_layer_inputs,
    # offload_layer_inputs_and_attention) or "auto": the fastest of none, save_attention_out, full and then the
    # offloading ones whose compiled step fits the device and the host budget (training.memory_plan).
    remat: str = choice("none", (*REMAT_POLICIES, "auto"), one_of=True)
    # Sequence-tiled MLP: each layer's MLP on chunks of at most this many tokens (0: whole rows;
    # ModelConfig.mlp_chunk_tokens). With remat auto the plan turns it on (AUTO_MLP_CHUNK_TOKENS) where untiled
    # nothing fits.
    mlp_chunk_tokens: int = ranged(0, ">= 0 (0: untiled)")
    # Under an offloading remat policy: how many layers (the first ones) save to pinned host memory; the rest keep
    # theirs on the device (ModelConfig.offloaded_layers). null: all. For a step whose offloaded activations
    # outgrow the host while the device has room. With a frozen base (LoRA) it costs nothing more; with full
    # parameters the partial layer range accumulates one more gradient-sized buffer (the plan's compile counts it).
    # remat auto sets it when every layer offloaded fits the device but not the host budget (training.memory_plan).
    offloaded_layers: int | None = ranged(None, ">= 0 (or null: all layers)")


@dataclass
class DataSection:
    """The training data: where it comes from, how it is tokenized, cut and packed into rows."""

    source: str = "synthetic"  # "synthetic" or a dataset path the data package reads
    # Several datasets blended (replaces `source` when given): entries `{path: P, ratio: 0.5}` (that fraction of
    # its rows), `{path: P, count: 1000}` (that many) or a plain path (all rows); see data.blend.
    sources: list = field(default_factory=list)
    chat_template: str | None = None  # Jinja template file replacing (or supplying) the tokenizer's
    eval_source: str | None = None  # held-out pairs (a dataset path); None: synthetic ones / none for a file source
    tokenizer: str | None = None  # tokenizer directory (HF files); None: the bundled tiny tokenizer
    seq_len: int = ranged(512, ">= 1")  # tokens per row (T): a packed row, or one sequence with layout "rows"
    # "packed": groups back to back in rows of seq_len (segment ids); "rows" (preference stages): one sequence
    # per row, a group's 1 + R rows side by side, each sample cut to seq_len: attention without segment ids
    # (the fast GPU layout for long pairs: cuDNN's flash backward; packing gains nothing at 1 group per row).
    layout: str = choice("packed", ("packed", "rows"))
    # Model rows per micro step, global over the data-parallel devices; an optimizer step takes
    # batch_rows x grad_accum rows. Packed: a row of seq_len tokens holding several groups. Rows layout: one
    # sequence per row, so a preference group takes 1 + num_rejects rows (batch_rows must be a multiple).
    batch_rows: int = ranged(8, ">= 1")
    num_rejects: int = ranged(1, ">= 0")  # rejected responses per group (R), preference stages
    max_groups_per_row: int = ranged(8, ">= 1")  # static bound on groups (or SFT samples) per row
    # Packed rows: at most this many groups (SFT samples) per row; null: as many as fit. 1 reproduces upstream
    # SFT's one sample per micro step (docs/upstream.md "Pairs per optimizer step").
    groups_per_row: int | None = ranged(None, ">= 1 or null")
    num_train: int = ranged(512, ">= 1")  # synthetic: training samples
    num_eval: int = ranged(128, ">= 0")  # synthetic: held-out pairs
    # Options of the synthetic generator (data.synthetic.training_rows): lengths, num_distractors, num_values.
    synthetic: dict = field(default_factory=dict)
    shuffle: bool = True  # shuffle the order of the training samples
    num_buckets: int = ranged(1, ">= 1")  # row lengths below seq_len (bucket_scheme): less padding, more compiles
    bucket_multiple: int = ranged(128, ">= 1")  # bucket lengths round up to this (a multiple of 2 x mesh.seq)
    # "halving": seq_len / 2^k; "linear": seq_len * (k + 1) / num_buckets (padding per row < seq_len / num_buckets)
    bucket_scheme: str = choice("halving", ("halving", "linear"))
    # Groups packed together by the pipeline (fuller rows vs first-batch latency and memory); null: 256 for rows
    # up to 16K tokens, fewer for longer rows (4M tokens of rows per window, data.pipeline.auto_window_groups).
    window_groups: int | None = ranged(None, ">= 1 or null")
    # Chat template's enable_thinking: null renders without the variable, as upstream training (Qwen3: the
    # response opens with the empty think block, which is trained); false moves that block into the masked prompt.
    enable_thinking: bool | None = None
    # Each sequence longer than its row, on its own: "prompt_middle" (the middle of the prompt goes, the response
    # stays), "right" (upstream's literal right cut, EOS forced) or "error". A pair is never cut as a whole: one
    # too long to share a row (packed layout) gets a row of its own, (1 + num_rejects) x seq_len long.
    truncation: str = choice("prompt_middle", ("prompt_middle", "right", "error"))
    # How a response ends: "upstream" (the template's end-of-turn token, then " " + EOS as text where EOS is
    # another token; the evaluator's DisRM score is then read one token later, after the template's newline) or
    # "template" (exactly as the chat template ends the turn: a DisRM is trained where `evaluate` reads its score;
    # data.tokenize module notes, docs/upstream.md "The DisRM score position").
    response_end: str = choice("upstream", RESPONSE_ENDS, one_of=True)
    worker_count: int = ranged(2, ">= 0")  # pipeline threads tokenizing / packing windows ahead


@dataclass
class LossSection:
    """The training loss of each stage (SimPO, Bradley-Terry, SFT's NLL) and its reduction."""

    # SimPO's reward scale: beta <= 0 flips (or erases) the preference, so a run would learn to prefer the
    # rejected answers. Upstream's recipes use 2.5 (and 2.0-10 in the SimPO paper).
    beta: float = ranged(2.5, "> 0 (it scales the reward margin; <= 0 inverts or erases the preference)")
    gamma: float = 0.5  # SimPO's target reward margin (absolute)
    label_smoothing: float = ranged(0.0, "in [0, 0.5)")  # SimPO sigmoid loss: weight of the flipped-label term
    nll_weight: float = ranged(0.0, ">= 0")  # SimPO: weight of the chosen response's mean NLL in the loss
    margin: float = 0.0  # Bradley-Terry: margin the chosen score must beat the rejected one by
    center_rewards_coefficient: float = 0.0  # Bradley-Terry: TRL's weight of (r_c + r_r)^2 (rewards near 0)
    chunk_tokens: int = ranged(8192, ">= 1")  # tokens per chunk of the fp32 logits in response log-probs
    # SimPO loss: "sigmoid" (-log s(z), label smoothing applies) or "hinge" (relu(1 - z)), z = beta dpi - gamma.
    loss_type: str = choice("sigmoid", ("sigmoid", "hinge"))
    # "upstream": mean over each microbatch's pairs, then over microbatches (SFT: mean over the step's samples of
    # per-sample token means, as upstream's one sample per micro-step);
    # "global_tokens": one mean over the global batch's pairs (SFT: trained tokens). docs/training.md,
    # "Loss reduction".
    reduction: str = choice("upstream", ("upstream", "global_tokens"))


@dataclass
class OptimSection:
    """AdamW and its learning-rate schedule (linear warmup, then cosine decay)."""

    lr: float = ranged(2e-6, "> 0")  # peak learning rate
    min_lr_ratio: float = ranged(0.1, "in [0, 1]")  # the schedule's final learning rate, as a fraction of lr
    warmup_ratio: float = ranged(0.05, "in [0, 1]")  # fraction of the optimizer steps that warm the rate up
    b1: float = ranged(0.9, "in [0, 1)")  # AdamW's first-moment decay
    b2: float = ranged(0.95, "in [0, 1)")  # AdamW's second-moment decay
    eps: float = ranged(1e-8, "> 0")  # AdamW's epsilon
    weight_decay: float = ranged(0.0, ">= 0")  # AdamW's decoupled weight decay
    grad_clip: float = ranged(1.0, ">= 0 (0: no clipping)")  # global gradient norm clipped to this
    # Keep the AdamW moments in pinned host memory between steps (training.state.offload_optimizer_state): the
    # gradient program, where activations peak, then has their bytes free on the device (Qwen3-8B, bf16: 30.5
    # GiB); the update program copies them in, updates and copies them back over PCIe every step.
    offload_state: bool = False


@dataclass
class LoraSection:
    """LoRA adapters (rank > 0) on a frozen base, or full fine-tuning (rank 0)."""

    rank: int = ranged(0, ">= 0 (0: full fine-tuning)")  # adapter rank; 0: full fine-tuning
    alpha: float = 8.0  # adapter scale: W + (alpha / rank) A B
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
    base_dtype: str | None = choice(None, ("float32", "bfloat16", None), note="(model.param_dtype)")


@dataclass
class CheckpointSection:
    """Orbax checkpoints: where, how often, how many, and what a full disk or a corrupt step does."""

    dir: str | None = None  # checkpoint directory; None: <output_dir>/checkpoints
    every: int = ranged(0, ">= 0 (0: only at the end)")  # save every N steps (0: only at the end)
    at_end: bool = True  # save the final step (benchmarks turn it off)
    keep: int = ranged(3, ">= 1")  # checkpoints kept (the newest ones)
    # Write a save while the next steps run (true) or before they start (false). null: asynchronous unless the
    # step keeps pinned host memory (offloaded activations or optimizer state): an asynchronous save holds a host
    # copy of the whole state beside the running step's pinned buffers, more than 128 GiB of host RAM holds for an
    # 8B full-parameter run with its moments on the host (docs/perf_training.md, "Checkpoints and pinned host").
    async_save: bool | None = None
    # A fresh (not --resume) run into a directory that already holds checkpoints: replace them (true) or stop
    # with an error (false).
    overwrite: bool = False
    # A save the disk cannot hold (checked before writing; orbax keeps older steps until the new one is complete):
    # "error" stops naming the sizes; "delete_oldest" deletes kept steps, oldest first, until it fits (for disks
    # that hold one checkpoint, e.g. an 8B full-parameter state of 49 GB on a 64 GB disk).
    on_low_disk: str = choice("error", ("error", "delete_oldest"))
    # A --resume whose newest step cannot be read: "fallback" names it, sets it aside and resumes from the newest
    # intact step (training.checkpoint_check); "error" stops (exit 2) naming it and moves nothing, for a user who
    # would rather repair or copy the step than lose the steps since the older one.
    on_corrupt: str = choice("fallback", ON_CORRUPT)
    # Host memory a save may use, in GB (None: orbax's defaults, which copy the whole state to host memory at once
    # and let up to 96 GB be in flight to the disk). Set it when the state is a large share of the host's RAM.
    save_host_gb: int | None = ranged(None, ">= 1 (or unset)")


@dataclass
class JudgeSection:
    """Generative judges (stages sft, simpo): held-out verdicts while training. A judged step is its saved
    checkpoint, exported and judged by the evaluator as ``python -m longrm_jax.evaluate --both-orders --limit
    SAMPLES --max-new-tokens N --dtype D`` judges that export: the same prompts, greedy decoding and verdict parser,
    so the figures equal that command's."""

    # Long-RewardBench task files to judge (a directory of {Task}.jsonl, or one file); null: off.
    data: str | None = None
    samples: int = ranged(16, ">= 1")  # samples judged per task file (evaluate's --limit), each in both orders
    max_new_tokens: int = ranged(64, ">= 1")  # a judgement's token budget (evaluate's --max-new-tokens)
    # Judge every N steps, at checkpoint steps (a multiple of checkpoint.every), and after the last step; 0: after
    # the last step only.
    every: int = ranged(0, ">= 0 (0: after the last step only)")
    dtype: str = choice("float32", ("float32", "bfloat16"))  # the judge's compute dtype (evaluate's --dtype)


@dataclass
class ProfileSection:
    """Trace optimizer steps [start, start + steps) (1-based) with jax.profiler; 0 steps: off. The trace (an XLA
    xplane, readable by TensorBoard's profile plugin, xprof or scripts/profile_summary.py) goes to `dir`."""

    # First optimizer step traced (1-based). Step 1 includes first-call work (autotuning, allocator growth): start
    # after it.
    start: int = ranged(2, ">= 1")
    steps: int = ranged(0, ">= 0 (0: off)")  # optimizer steps traced; 0: no trace
    dir: str | None = None  # trace directory; None: <output_dir>/profile


@dataclass
class DistributedSection:
    """Multi-process runs (jax.distributed): one process per host or per GPU (training.distributed)."""

    # "auto": initialise when a cluster environment is detected; "on": always (needs the fields or env);
    # "off": never.
    mode: str = choice("auto", ("auto", "on", "off"))
    coordinator_address: str | None = None  # host:port of process 0; None: from the environment
    num_processes: int | None = None  # processes in the run; None: from the environment
    process_id: int | None = None  # this process's index; None: from the environment


@dataclass
class TrainConfig:
    """A training run: its stage, length, logging and checks, then one section per concern."""

    # Training stage: "sft" (a generative judge's NLL), "simpo" (preference pairs, SimPO loss) or "bt" (a score
    # head, Bradley-Terry loss).
    stage: str = choice("bt", ("sft", "simpo", "bt"), one_of=True)
    seed: int = 0  # parameter init, data order and synthetic data
    output_dir: str = "runs/default"  # the run's directory: metrics, logs, config, checkpoints
    steps: int = ranged(0, ">= 0 (0: train for `epochs`)")  # optimizer steps; 0: `epochs` passes over the data
    epochs: float = ranged(1.0, "> 0")  # passes over the training data when steps is 0
    grad_accum: int = ranged(1, ">= 1")  # micro steps per optimizer step, each of data.batch_rows rows
    log_every: int = ranged(1, ">= 1")  # log metrics every N optimizer steps
    eval_before: bool = True  # held-out evaluation before the first step
    eval_after: bool = True  # held-out evaluation after the last step
    eval_every: int = ranged(0, ">= 0 (0: before and after training only)")  # held-out evaluation every N steps
    # A progress bar (true) or a line per logged step (false); null: the bar on a terminal, lines otherwise (a bar
    # redrawn into a log file is one long line of carriage returns).
    progress: bool | None = None
    tensorboard: bool = True  # also write the metrics as TensorBoard events
    # Before loading weights the trainer compiles the step and stops if its predicted memory exceeds the
    # device's (training.memory_plan).
    memory_check: bool = True
    # That check's per-device budget in GiB; None: the device allocator's limit (CPU: 90% of the host's free RAM
    # over its CPU devices, training.host_memory).
    memory_budget_gib: float | None = ranged(None, "> 0 (or unset)")
    # Pinned host memory per device for offloaded activations (model.remat offload_*), in GiB; None: 75% of the
    # host's RAM over this process's devices.
    host_memory_budget_gib: float | None = ranged(None, "> 0 (or unset)")
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
    judge: JudgeSection = field(default_factory=JudgeSection)
    profile: ProfileSection = field(default_factory=ProfileSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)

    def validate(self) -> "TrainConfig":
        self._check_ranges()
        if self.data.batch_rows % self.group_rows:
            raise ConfigError(
                f"data.batch_rows ({self.data.batch_rows}) must be a multiple of 1 + data.num_rejects "
                f"({self.group_rows}) with data.layout rows: each sequence of a preference group takes a row")
        if self.stage == "bt" and self.model.head == "causal_lm":
            raise ConfigError("stage bt needs a score head (model.head: classifier or auto)")
        if self.stage != "bt" and self.model.head == "classifier":
            raise ConfigError(f"stage {self.stage} needs an LM head (model.head: causal_lm or auto)")
        if self.data.layout == "rows" and self.stage == "sft":
            raise ConfigError("data.layout rows is for preference stages (simpo, bt); sft packs samples")
        problem = mesh_problem(self.mesh, self.data.seq_len)
        if problem:
            raise ConfigError(problem)
        if self.stage != "sft" and self.data.num_rejects < 1:
            raise ConfigError(f"data.num_rejects must be >= 1 for stage {self.stage} (each preference group trains "
                              f"its chosen response against that many rejected ones); got {self.data.num_rejects}")
        _check_synthetic_options(self.data.synthetic)
        _check_model_overrides(self.model.overrides)
        self._check_judge()
        return self

    def _check_judge(self) -> None:
        """Held-out judging reads the saved checkpoint of a judged step: a generative stage, a save after the
        last step, and judged steps among the saved ones."""
        judge = self.judge
        if judge.data is None:
            return
        if self.head != "causal_lm":
            raise ConfigError(f"judge.data: held-out judging is for generative judges (stages sft, simpo with an "
                              f"LM head); stage {self.stage} trains a score head (its held-out figure is the "
                              "pairwise accuracy). Unset judge.data")
        if not self.checkpoint.at_end:
            raise ConfigError("judge.data needs checkpoint.at_end: true (the last step's checkpoint is what is judged)")
        if judge.every and (not self.checkpoint.every or judge.every % self.checkpoint.every):
            raise ConfigError(f"judge.every ({judge.every}) must be a multiple of checkpoint.every "
                              f"({self.checkpoint.every}): a judged step is a saved one")

    def _check_ranges(self) -> None:
        """A value outside the range or choices its field declares (``ranged``, ``choice``: a negative step
        count, learning rate, an unknown stage, ...) would run and train nothing or crash deep inside; stop here
        naming the key."""
        problem = out_of_range(self)
        if problem:
            raise ConfigError(problem)

    @property
    def evaluates_held_out(self) -> bool:
        """Whether the run evaluates held-out pairs at all: before, after or every ``eval_every`` steps."""
        return self.eval_before or self.eval_after or self.eval_every > 0

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
        return self.data.batch_rows // self.group_rows * self.grad_accum

    @property
    def group_rows(self) -> int:
        """Model rows one preference group takes: 1 + num_rejects in the rows layout (a sequence per row), else 1
        (packed rows hold whole groups; SFT has no groups)."""
        return 1 + self.data.num_rejects if self.data.layout == "rows" and self.stage != "sft" else 1

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
