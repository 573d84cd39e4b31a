"""`engine serve` and `engine generate`. Bad input gives one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import logging
import sys

from kernels.errors import KernelloopError


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, metavar="DIR", help="Hugging Face-format model directory (default: the embedded model)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--kernels", default=None, choices=("reference", "baseline", "registry"),
                   help="reference torch ops (CPU default), baseline Triton kernels, or the registry's (GPU default)")
    p.add_argument("--registry", default=None, metavar="PATH", help="kernel registry (with --kernels registry)")
    p.add_argument("--kv-cache-mb", type=int, default=None, help="KV cache budget in MiB")
    p.add_argument("--max-running", type=int, default=32, help="most requests decoding at once")
    p.add_argument("--no-prefix-cache", action="store_true")


def engine_config(args: argparse.Namespace):
    import torch

    from engine.engine import EngineConfig
    from engine.scheduler import SchedulerConfig

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    kernels = args.kernels or ("registry" if device == "cuda" else "reference")
    if args.registry and kernels != "registry":
        raise KernelloopError("--registry is only used with --kernels registry")
    return EngineConfig(
        model=args.model, device=device, dtype=args.dtype, kernels=kernels, registry=args.registry,
        kv_cache_bytes=args.kv_cache_mb << 20 if args.kv_cache_mb else None, prefix_cache=not args.no_prefix_cache,
        scheduler=SchedulerConfig(max_running_requests=args.max_running),
    )


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from engine.engine import Engine
    from engine.loop import EngineLoop
    from engine.server import create_app

    engine = Engine(engine_config(args))
    name = args.served_model_name or engine.model_dir.name
    loop = EngineLoop(engine).start()
    print(f"serving {name} ({engine.model_config.num_layers} layers, {engine.dtype}, kernels={engine.config.kernels}) "
          f"on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    try:
        uvicorn.run(create_app(loop, name), host=args.host, port=args.port, log_level="warning")
    finally:
        loop.stop()
    return 0


def generate(args: argparse.Namespace) -> int:
    from engine.engine import Engine
    from engine.sampling import SamplingParams

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
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="model id in the API (default: the directory name)")
    p.set_defaults(run=serve)
    p = sub.add_parser("generate", help="complete one prompt and print the text")
    add_engine_args(p)
    p.add_argument("prompt")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
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
