"""The evaluation CLI's flags: ``python -m longrm_jax.evaluate``'s parser (argument groups), the checks of their
values, the GPU decode flags they imply, and the argv a replica process gets. The CLI itself (and ``score``'s
``--mesh``) read them from here."""

from __future__ import annotations

import argparse
import logging
import os

from longrm_jax.cli_support import (InputError, add_debug_flag, add_no_progress_flag, add_strict_kernels_flag,
                                    add_topology_flags, cli_parser)
from longrm_jax.compile_cache import AUTO, HELP, OFF
from longrm_jax.evaluation.encoding import UPSTREAM_MAX_LENGTH
from longrm_jax.evaluation.samples import DEFAULT_SEED
from longrm_jax.flag_files import CONFIG_DEST, SET_DEST, add_config_flags
from longrm_jax.parallel.mesh import MESH_AXES
from longrm_jax.parallel.topology import program_budget
from longrm_jax.xla_flags import GPU_DECODE_XLA_FLAGS, add_gpu_xla_flags

log = logging.getLogger("longrm_jax.evaluate")  # the CLI's logger: its lines keep the CLI's name
DESCRIPTION = ("Evaluate a generative (default) or discriminative (--is-disrm) reward model on Long-RewardBench task "
               "files ({Task}.jsonl) or Long-form RewardBench records. Writes results.csv (upstream layout), "
               "results.json (+AUC, both-orders agreement), predictions.jsonl and accuracy_by_length.png under "
               "--save-path.")


def parse_mesh(text: str | None) -> dict[str, int] | None:
    """``"data=1,fsdp=4,seq=2"`` -> {"data": 1, "fsdp": 4, "seq": 2}; unnamed axes default to 1, except
    ``fsdp``, which takes the devices left over (``make_mesh``'s -1)."""
    if not text:
        return None
    mesh = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in MESH_AXES or not value.strip().lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(
                f"--mesh: bad entry {part!r}; expected comma-separated AXIS=SIZE with AXIS in {MESH_AXES}")
        mesh[name] = int(value)
    return mesh


def parse_replicas(text: str) -> str:
    if text == "auto" or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"--replicas: expected auto or a count >= 1, got {text!r}")


def replica_argv(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """``(save_dir, samples_file) -> argv`` of a replica process: this run's flags as parsed (defaults left
    out), its own save path and share, one process, no progress bar, and no verdict check (the merged run
    checks)."""
    own = {"save_path", "replicas", "only_samples", "no_progress", "allow_no_verdicts", "overwrite", "resume",
           "help", CONFIG_DEST, SET_DEST}  # --config / --set: already read into the flags
    common: list[str] = []
    for action in parser._actions:  # noqa: SLF001 - argparse's public way to list them is this attribute
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest in own or value is None or value == action.default:
            continue
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):  # noqa: SLF001
            common.append(flag)
        elif isinstance(value, dict):  # --mesh
            common += [flag, ",".join(f"{k}={v}" for k, v in value.items())]
        elif isinstance(value, (list, tuple)):
            common += [flag, *map(str, value)]
        else:
            common += [flag, str(value)]
    again = ["--resume"] if args.resume else ["--overwrite"]  # the parent checked the save path already

    def argv(save_dir: str, samples_file: str) -> list[str]:
        return [*common, *again, "--save-path", save_dir, "--only-samples", samples_file, "--replicas", "1",
                "--no-progress", "--allow-no-verdicts"]

    return argv


def build_parser() -> argparse.ArgumentParser:
    parser = cli_parser("longrm_jax.evaluate", DESCRIPTION)
    _model_and_data_args(parser.add_argument_group("model and data"))
    _generation_args(parser.add_argument_group("generation and scoring"))
    _device_args(parser.add_argument_group("devices"))
    _run_args(parser.add_argument_group("the run"))
    _compile_only_args(parser.add_argument_group("compile only"))
    add_config_flags(parser)
    return parser


def _model_and_data_args(group) -> None:
    """What is judged: the model, the task files, how samples are read and truncated."""
    group.add_argument("--model-path", required=True,
                        help="local Hugging Face checkpoint directory (config.json, safetensors, tokenizer); with "
                             "--compile-only also a directory with only config.json, or a preset name "
                             "(qwen3_8b, llama31_8b, mistral_7b, mistral_nemo_12b, qwen25_7b, gemma3_1b, "
                             "gemma3_12b)")
    group.add_argument("--data-path", default=None,
                        help="directory holding {Task}.jsonl files (or one .jsonl file): the benchmark data "
                             "(required unless --compile-only)")
    group.add_argument("--is-disrm", action="store_true",
                        help="discriminative RM (sequence classifier): score each answer with the reward head "
                             "instead of generating a judgement")
    group.add_argument("--save-path", default=None,
                        help="output directory (default: results/<model directory name>)")
    group.add_argument("--tasks", nargs="+", default=None,
                        help="task files to evaluate (default: LongQA Summ Safety ICL Cite Code Math where "
                             "present, else every *.jsonl in --data-path)")
    group.add_argument("--task-types", nargs="+", default=None, choices=("PairWise", "BestOfN"),
                        help="Long-RewardBench: evaluate only these sample types (default: both)")
    group.add_argument("--longform-protocol", default="upstream", choices=("upstream", "pointwise", "joint"),
                        help="GRM on Long-form RewardBench records: upstream (default: the benchmark's own "
                             "protocol exactly: each response judged alone by its raw-text prompt, no chat "
                             "template, the first strict '**Result:** x.y' is the score, an unparsed score makes "
                             "the sample wrong and leaves its pairs out of binary accuracy), pointwise (ours: each "
                             "response alone through the chat template, lenient parser, an unparsed score loses) "
                             "or joint (all answers ranked in one prompt)")
    group.add_argument("--chat-template", default=None, metavar="FILE",
                        help="Jinja chat template file used instead of the tokenizer's (for tokenizers that "
                             "have none)")
    group.add_argument("--max-length", type=int, default=UPSTREAM_MAX_LENGTH,
                        help="middle truncation: a sequence of this many tokens or more keeps its first "
                             "max/2 and last max/2-5 tokens (default and upstream: %(default)s)")
    group.add_argument("--no-truncate", action="store_true",
                        help="judge contexts whole (pair with --mesh seq=N so the prefill is split over devices)")
    group.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="seed of the per-task answer permutation (default and upstream: %(default)s)")
    group.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="compute dtype. auto (default): DisRM scores in the checkpoint's dtype (config.json "
                             "torch_dtype; bfloat16 rounds close reward scores into ties and flips); a GRM "
                             "generates in bfloat16. float16 is what upstream scores in")
    group.add_argument("--both-orders", action="store_true",
                        help="also judge the swapped order (pairwise) / every cyclic rotation (Best-of-N) and "
                             "report position-bias agreement in results.json")
    group.add_argument("--limit", type=int, default=None, help="evaluate at most N samples per task file")


def _generation_args(group) -> None:
    """How a GRM generates its judgements and a DisRM scores: batches, slots, decode kernels."""
    group.add_argument("--max-new-tokens", type=int, default=None,
                        help="GRM: generation budget per judgement, greedy (default: 2048; Long-form records "
                             "under the upstream protocol: 1024, as the benchmark's script)")
    group.add_argument("--batch-size", type=int, default=None,
                        help="DisRM and static GRM batches: maximum rows per model call, reduced for long buckets "
                             "by --max-batch-tokens (default 4). GRM continuous batching: the number of slots "
                             "(default: as many as the device's memory holds next to the weights, logged)")
    group.add_argument("--max-batch-tokens", type=int, default=131_072,
                        help="DisRM and static GRM batches: cap on rows x padded length per call; GRM counts "
                             "prompt + --max-new-tokens (default: %(default)s)")
    group.add_argument("--static-batches", action="store_true",
                        help="GRM: static length-bucket batches, each decoded until its last row is done, "
                             "instead of continuous batching (a finished row refilled with the next prompt; "
                             "one device only: a multi-device mesh always runs static batches)")
    group.add_argument("--queue", choices=("run", "per-task"), default="run",
                        help="GRM: run: the judge prompts of every task file in one generation queue (slots fill "
                             "with prompts of every task at each length; default); per-task: one queue per task "
                             "file (the earlier schedule, same predictions)")
    group.add_argument("--decode-chunk", type=int, default=16,
                        help="GRM continuous batching: decode steps per host round trip (a call returns early "
                             "when a row finishes and prompts wait) (default: %(default)s)")
    group.add_argument("--decode-attention", choices=("auto", "xla", "pallas"), default="auto",
                        help="GRM: attention of a decode step over the KV cache. pallas: a Triton kernel that "
                             "reads the cache in place (GPU, one device); xla: two batched matmuls (any backend "
                             "and mesh). auto: pallas on one GPU, else xla (default: %(default)s)")
    group.add_argument("--unroll-decode-layers", choices=("auto", "on", "off"), default="auto",
                        help="GRM with the pallas decode attention: unroll the layer loop of a decode step (about "
                             "5%% faster per token, about 8 s more compile per decode program). auto: on when the "
                             "run's token budget (samples x --max-new-tokens) is large enough to pay for the "
                             "compiles (default: %(default)s)")
    group.add_argument("--device-memory-gib", type=float, default=None,
                        help="GRM continuous batching: memory to size the slot pool by, instead of the device's "
                             "reported limit (memory_stats bytes_limit)")
    group.add_argument("--simulate-judgement-lengths", action="store_true",
                        help="benchmarking random-weight models only: end each judgement after a deterministic "
                             "per-prompt number of tokens drawn like real judgement lengths (a random model "
                             "never writes EOS; see longrm_jax.evaluation.grm.simulated_lengths). The verdicts are "
                             "then meaningless")
    group.add_argument("--share-prompt", action="store_true",
                        help="DisRM: compute each sample's shared prompt once and score only the answers on top "
                             "of its KV cache (same scores, 2-4x fewer FLOPs; single device)")
    group.add_argument("--no-gpu-flags", action="store_true",
                        help="GRM: do not add the GPU decode XLA flags. By default a GRM run on a GPU appends "
                             + " ".join(GPU_DECODE_XLA_FLAGS) + " to XLA_FLAGS at startup (cuBLAS matmuls "
                             "read each scanned layer's weights in place: decode 61.5 -> 81.9 tokens/s for "
                             "Qwen3-8B at 32K on an H200). Never added for --is-disrm (they slow the prefill: "
                             "17.4K -> 15.3K tokens/s) nor on the CPU; flags already in XLA_FLAGS are kept")


def _device_args(group) -> None:
    """Which devices run it: a mesh for one program, or one replica process per GPU."""
    group.add_argument("--mesh", type=parse_mesh, default=None,
                        help="device mesh, e.g. data=1,fsdp=8 or fsdp=2,seq=4 (seq > 1: ring attention over "
                             "the sequence). Default: one device; with --compile-only, fsdp over every chip of "
                             "the topology")
    group.add_argument("--replicas", default="auto", type=parse_replicas, metavar="auto|N",
                        help="one evaluation process per GPU, each judging a share of the samples (shared out by "
                             "predicted cost) with the weights replicated, the results merged as one run's. auto "
                             "(default): one per visible GPU when there are several, no --mesh is given and the "
                             "weights leave room for a cache on one GPU; 1: one process; N: the first N GPUs (on a "
                             "host without GPUs, N CPU processes). Logs under SAVE_PATH/replicas/rI/")
    group.add_argument("--replica-max-tokens", type=int, default=None, metavar="N",
                        help="with replicas: samples of more than N tokens (estimated from their characters) go "
                             "to no replica but are judged after them by one program over a seq mesh of the "
                             "replicas' GPUs (ring-attention prefill). Default: those whose cache and prefill "
                             "would not fit one GPU beside the weights")
    group.add_argument("--only-samples", default=None, metavar="FILE", help=argparse.SUPPRESS)  # a replica's share


def _run_args(group) -> None:
    """Resuming, overwriting, exit status, progress and fallbacks."""
    group.add_argument("--compilation-cache", default=AUTO, metavar="DIR",
                        help=HELP + ": later runs reuse the compiled bucket shapes instead of recompiling them")
    group.add_argument("--resume", action="store_true",
                        help="reuse the predictions of task files a previous run with the same settings finished "
                             "(saved under SAVE_PATH/partial as each task file completes), and of the GRM samples "
                             "it finished in files it did not (journaled there as each sample completes)")
    group.add_argument("--overwrite", action="store_true",
                        help="replace the results of an earlier evaluation in --save-path (without it, and without "
                             "--resume, such a save path is refused)")
    group.add_argument("--allow-no-verdicts", action="store_true",
                        help="exit 0 even when no GRM judgement holds a parsable verdict (speed runs on random "
                             "weights); without it such a run exits 3, its outputs written all the same")
    add_no_progress_flag(group)
    add_strict_kernels_flag(group, "a broken tokamax import, a failed memory_stats() shrinking the GRM slot pool, "
                                   "...")
    add_debug_flag(group)


def _compile_only_args(group) -> None:
    """Compile the programs for a topology without weights, data or accelerator."""
    add_topology_flags(group, "the evaluator's programs (DisRM: scoring; GRM: prefill and decode) at "
                              "--compile-length tokens x --batch-size rows (default 1 here)",
                       "a TPU slice (v5p-8, v6e-16) or GPU hosts (h100x8, h200x1)")
    group.add_argument("--compile-length", type=int, default=None, metavar="TOKENS",
                        help="with --compile-only: prompt length to compile for (default: --max-length)")


def _gpu_backend_possible(environ) -> bool:
    """Whether JAX could start a GPU backend in this process, decided without starting any backend."""
    platforms = environ.get("JAX_PLATFORMS", "").lower()
    if platforms and not any(name in platforms for name in ("cuda", "gpu", "rocm")):
        return False
    import importlib.metadata  # these three: only when JAX_PLATFORMS leaves a GPU possible
    import importlib.util
    import pkgutil

    names = [entry.name for entry in importlib.metadata.entry_points(group="jax_plugins")]
    if importlib.util.find_spec("jax_plugins") is not None:
        import jax_plugins  # a namespace package that exists only where a plugin is installed

        names += [module.name for module in pkgutil.iter_modules(jax_plugins.__path__)]
    return any("cuda" in name or "rocm" in name for name in names)


def apply_gpu_decode_flags(args: argparse.Namespace, environ=None) -> bool:
    """Add the GPU decode XLA flags (``longrm_jax.xla_flags``) for a GRM run; True if they were added.

    Must run before any JAX device use (XLA reads its flags when the backend starts). Skipped for DisRM
    scoring (measured slower prefill with them), with ``--no-gpu-flags``, without a GPU plugin or with
    ``JAX_PLATFORMS`` naming no GPU, and when a backend already runs (too late to take effect).
    """
    from jax._src import xla_bridge  # noqa: PLC0415 - private, but the only way to ask without starting one

    environ = os.environ if environ is None else environ
    if args.is_disrm or args.no_gpu_flags or not _gpu_backend_possible(environ):
        return False
    if xla_bridge.backends_are_initialized():
        log.warning("JAX backend already started: GPU decode XLA flags not applied")
        return False
    add_gpu_xla_flags(environ=environ)
    log.info("GRM decode XLA flags: XLA_FLAGS=%s", environ["XLA_FLAGS"])
    return True


def check_args(args: argparse.Namespace) -> None:
    """Refuse flag values that would run and give a wrong or empty result, before any model, data or backend is
    touched: every error names the flag and what it needs (exit status 2)."""
    for name in LEAST:
        problem = setting_problem(name, getattr(args, name))
        if problem:
            raise InputError(f"--{name.replace('_', '-')} {problem}")
    if args.device_memory_gib is not None and not args.device_memory_gib > 0:
        raise InputError(f"--device-memory-gib must be > 0, got {args.device_memory_gib}")
    for axis, size in (args.mesh or {}).items():
        if size < 1 and not (axis == "fsdp" and size == -1):
            raise InputError(f"--mesh {axis}={size}: sizes must be >= 1 (fsdp=-1: the devices left over)")
    if not os.path.isdir(args.model_path):
        raise InputError(f"--model-path {args.model_path}: not a directory (a local Hugging Face checkpoint "
                         "directory is needed)")
    if not os.path.exists(args.data_path):
        raise InputError(f"--data-path {args.data_path} does not exist")
    if args.chat_template is not None and not os.path.isfile(args.chat_template):
        raise InputError(f"--chat-template {args.chat_template}: no such file")
    cache = None if args.compilation_cache in (AUTO, OFF) else args.compilation_cache
    for flag, path in (("--save-path", args.save_path), ("--compilation-cache", cache)):
        if path is not None:
            _check_writable_dir(flag, path)


# A GRM's judgement budget when --max-new-tokens is not given (upstream's eval.py), for a run and its compile.
DEFAULT_MAX_NEW_TOKENS = 2048

# --max-length keeps the first max/2 and the last max/2 - 5 tokens: below this, the kept tail is a few tokens.
MIN_MAX_LENGTH = 16

# The evaluator's count settings and their least values, by name (the flag is --NAME with dashes; the Python API
# takes the same names), and its compute dtypes: one rule for the CLI and the API (setting_problem).
LEAST = {"max_new_tokens": 1, "batch_size": 1, "max_batch_tokens": 1, "decode_chunk": 1, "limit": 1,
         "max_length": MIN_MAX_LENGTH, "replica_max_tokens": 1}
DTYPES = ("auto", "bfloat16", "float32", "float16")
MAX_COUNT = 2**31 - 1


def setting_problem(name: str, value) -> str | None:
    """What is wrong with ``value`` for the evaluator setting ``name`` (a key of ``LEAST``, or ``dtype``), as the
    end of an error message ("must be >= 16, got 0"); None when it is fine (None is fine: unset)."""
    if value is None:
        return None
    if name == "dtype":
        return None if value in DTYPES else f"must be one of {', '.join(DTYPES)}, got {value!r}"
    least = LEAST[name]
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer >= {least}, got {value!r}"
    if value > MAX_COUNT:  # counts reach jitted programs as 32-bit integers
        return f"must be at most {MAX_COUNT:,}, got {value}"
    return f"must be >= {least}, got {value}" if value < least else None


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
