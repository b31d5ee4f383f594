"""``python -m longrm_jax.serve``: a reward model over HTTP for RL frameworks (OpenRLHF, verl, TRL).

A DisRM (``--is-disrm``) answers ``/get_reward`` (OpenRLHF), ``/classify`` (vLLM's shape, verl) and ``/score``; a
generative judge answers ``/judge`` and ``/v1/chat/completions``; both ``/health`` and ``/metrics``. Concurrent
requests are scored together (``serving.batcher``). Settings: one flag per key, ``--config FILE`` (YAML) and
``--set KEY=VALUE`` (docs/serving.md). Ctrl-C or SIGTERM stops accepting, finishes the requests in flight and
exits 0.
"""

from __future__ import annotations

import logging
import sys

from longrm_jax.cli_support import ExitStatus, add_debug_flag, cli_parser, configure_logging, run_cli

DESCRIPTION = ("Serve a reward model over HTTP in the shapes RL frameworks send: a DisRM's scores (/get_reward, "
               "/classify, /score) or a generative judge's judgements (/judge, /v1/chat/completions).")


def build_parser():
    from longrm_jax.schema_flags import add_schema_flags
    from longrm_jax.serving.config import ServeConfig

    parser = cli_parser("longrm_jax.serve", DESCRIPTION, examples=[
        "python -m longrm_jax.serve --model-path runs/tiny_disrm_hf --is-disrm --port 8000",
        "python -m longrm_jax.serve --model-path runs/tiny_grm_hf --set max_new_tokens=256"], show_defaults=True)
    add_schema_flags(parser, ServeConfig)
    add_debug_flag(parser)
    return parser


def _serve(argv: list[str]) -> int:
    from longrm_jax.schema_flags import config_from_args
    from longrm_jax.serving.config import ServeConfig

    cfg = config_from_args(build_parser().parse_args(argv), ServeConfig)  # a refusal: run_cli's one line, exit 2
    configure_logging()
    from aiohttp import web

    from longrm_jax.compile_cache import enable_compilation_cache

    enable_compilation_cache(cfg.compilation_cache)

    from longrm_jax.serving.app import build_app

    logging.getLogger(__name__).info("loading %s; GET /health answers 200 once it is ready", cfg.model_path)
    # handler_cancellation: a client that disconnects cancels its request, whose queued work is then dropped.
    web.run_app(build_app(cfg), host=cfg.host, port=cfg.port, handler_cancellation=True, print=None,
                access_log=None)
    return ExitStatus.OK


def main(argv: list[str] | None = None) -> int:
    return run_cli(_serve, argv)


if __name__ == "__main__":
    sys.exit(main())
