"""`engine serve` and `engine generate`. Bad input gives one line on stderr and exit 2.

Context length: the engine serves requests of at most `max_model_len` tokens (prompt + output):
the model's positions (at most 8192) or `--max-model-len`, lowered (with a warning) when the KV
cache (`--kv-cache-mb`) holds fewer tokens. An explicit `--max-model-len` larger than the model's
positions or than the KV cache holds is refused (one line, exit 2), not clamped: asking for a
length is asking for that length. /v1/models reports the length really served.
"""

from __future__ import annotations

import argparse
import logging
import sys

from kernelloop.common.errors import KernelloopError


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, metavar="DIR|NAME",
                   help="Hugging Face-format model directory, or a known model's name converted once into the "
                        "cache (smollm2) (default: the embedded model)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="weights and activations (default auto: float32 on CPU, the checkpoint's dtype on a GPU)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--kernels", default=None, choices=("reference", "baseline", "registry"),
                   help="reference torch ops (CPU default), baseline Triton kernels, or the registry's (GPU default)")
    p.add_argument("--registry", default=None, metavar="PATH", help="kernel registry (with --kernels registry)")
    p.add_argument("--fallback", default="baseline", choices=("baseline", "reference"),
                   help="with --kernels registry, what serves an op no registry entry covers: its baseline Triton "
                        "kernel (default) or the torch reference (fast on CPU, where Triton is interpreted)")
    p.add_argument("--deterministic", action="store_true",
                   help="serve only batch-invariant kernel variants: a request decodes the same tokens alone, in any "
                        "batch and from the prefix cache (slower where no invariant registry kernel exists; /metrics "
                        "lists those fallbacks)")
    p.add_argument("--kv-cache-mb", type=int, default=None,
                   help="KV cache budget in MiB (default: 256 on CPU, 85%% of free GPU memory)")
    p.add_argument("--max-model-len", type=int, default=None, metavar="N",
                   help="most tokens per request, prompt + output (default: the model's positions, at most 8192, "
                        "or what the KV cache holds if less); more than the model or the KV cache allows is an error")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (intra- and inter-op), set before the engine is built (default: torch's)")
    p.add_argument("--max-running", type=int, default=32, help="most requests decoding at once")
    p.add_argument("--no-prefix-cache", action="store_true", help="do not reuse the KV cache of shared prompt prefixes")
    p.add_argument("--chunked-prefill-size", type=positive_int, default=2048, metavar="N",
                   help="prefill at most N tokens of one prompt per step; with --mixed-chunk, at most N tokens per "
                        "step in all (prefill plus one per running request) (default 2048)")
    p.add_argument("--mixed-chunk", action="store_true",
                   help="run a prefill chunk in the same step as the running decodes, so arrivals do not stall "
                        "running streams (as SGLang's --enable-mixed-chunk; ignored with --deterministic)")
    p.add_argument("--admission-window-ms", type=float, default=5.0, metavar="MS",
                   help="hold a step that would admit a fresh arrival until MS milliseconds after it arrived, so a "
                        "burst lands in one prefill (default 5; 0: off)")
    p.add_argument("--admission-gap-ms", type=float, default=1.0, metavar="MS",
                   help="...but stop holding once no request has arrived or been in reading for MS milliseconds, so "
                        "a lone request waits only that long (default 1)")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def set_threads(n: int | None) -> None:
    """--threads: torch's intra-op and inter-op thread pools, before any parallel work."""
    if n is None:
        return
    if n < 1:
        raise KernelloopError(f"--threads must be at least 1, not {n}")
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # only settable once, before parallel work started (an embedding caller's process)
        logging.getLogger(__name__).warning("inter-op threads already fixed at %d; --threads %d sets intra-op only",
                                            torch.get_num_interop_threads(), n)


def engine_config(args: argparse.Namespace):
    set_threads(args.threads)
    from kernelloop.engine.engine import EngineConfig
    from kernelloop.engine.scheduler import SchedulerConfig
    from kernelloop.kernels.device import resolve_device

    device = resolve_device(args.device)
    kernels = args.kernels or ("reference" if device.interpreted else "registry")
    if args.registry and kernels != "registry":
        raise KernelloopError("--registry is only used with --kernels registry")
    if args.fallback != "baseline" and kernels != "registry":
        raise KernelloopError("--fallback is only used with --kernels registry")
    if not 0 <= args.admission_window_ms <= 1000:
        raise KernelloopError(f"--admission-window-ms must be between 0 and 1000, not {args.admission_window_ms}")
    if not 0 <= args.admission_gap_ms <= 1000:
        raise KernelloopError(f"--admission-gap-ms must be between 0 and 1000, not {args.admission_gap_ms}")
    return EngineConfig(
        model=args.model, device=device, dtype=args.dtype, kernels=kernels, registry=args.registry,
        fallback=args.fallback, deterministic=args.deterministic,
        kv_cache_bytes=args.kv_cache_mb << 20 if args.kv_cache_mb else None, max_context=args.max_model_len,
        prefix_cache=not args.no_prefix_cache,
        scheduler=SchedulerConfig(max_running_requests=args.max_running, chunk_size=args.chunked_prefill_size,
                                  mixed=args.mixed_chunk, admission_window=args.admission_window_ms / 1000,
                                  admission_gap=args.admission_gap_ms / 1000),
    )


def serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    import uvicorn

    from kernelloop.engine.audit_queue import AuditQueue
    from kernelloop.engine.engine import Engine
    from kernelloop.engine.loop import EngineLoop
    from kernelloop.engine.model_source import KNOWN_MODELS
    from kernelloop.engine.server import create_app

    if not 0.0 <= args.audit_rate <= 1.0:
        raise KernelloopError(f"--audit-rate must be between 0 and 1, not {args.audit_rate}")
    engine = Engine(engine_config(args))
    # A known model answers to the name it was asked by (`--model smollm2`), a directory to its own name.
    known = args.model and args.model.lower() in KNOWN_MODELS
    names = args.served_model_name or [args.model.lower() if known else engine.model_dir.name]
    loop = EngineLoop(engine, stream_interval=args.stream_interval)
    server = uvicorn.Server(uvicorn.Config(create_app(loop, names, audit=AuditQueue(args.audit_rate)), host=args.host, port=args.port, log_level="warning"))
    # The engine steps on the main thread (faster on CPU), the HTTP server's event loop in a thread;
    # uvicorn installs no signal handlers outside the main thread, so SIGTERM is handled here.
    http = threading.Thread(target=server.run, name="http", daemon=True)

    def shut_down(*_) -> None:
        server.should_exit = True
        loop.stop()

    signal.signal(signal.SIGTERM, shut_down)
    http.start()
    print(f"serving {', '.join(names)} ({engine.model_config.num_layers} layers, {engine.dtype}, "
          f"kernels={engine.config.kernels}, max_model_len={engine.max_model_len}) "
          f"on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    try:
        loop.run_here(keep_going=http.is_alive)
    except KeyboardInterrupt:
        pass
    finally:
        server.should_exit = True
        http.join(timeout=10)
    if not server.started:
        raise KernelloopError(f"could not serve on {args.host}:{args.port} (is the port in use?)")
    return 0


def generate(args: argparse.Namespace) -> int:
    from kernelloop.engine.engine import Engine
    from kernelloop.engine.sampling import SamplingParams

    engine = Engine(engine_config(args))
    if args.chat:
        text = engine.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
    else:
        ids = engine.tokenizer.encode(args.prompt)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    req = engine.generate([ids], params)[0]
    print(engine.tokenizer.decode(req.output_ids))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="engine", description="kernelloop's SGLang-style inference engine")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--stream-interval", type=positive_int, default=1, metavar="N",
                   help="streamed requests get a chunk every N tokens (the first at once); more than 1 spends "
                        "less of the CPU on the HTTP side under many streams (as SGLang's --stream-interval)")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model ids the API answers to, one or more (default: the directory name); "
                        "/v1/models lists them all, responses echo the one asked for")
    p.add_argument("--audit-rate", type=float, default=0.01, metavar="R",
                   help="share of finished requests sampled for the shadow audit (`agent audit`, `agent daemon`) "
                        "to re-score with the float32 reference (default 0.01; 0: off)")
    p.set_defaults(run=serve)
    p = sub.add_parser("generate", help="complete one prompt and print the text")
    add_engine_args(p)
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: none)")
    p.set_defaults(run=generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except (KernelloopError, ValueError) as exc:
        print(f"engine {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
