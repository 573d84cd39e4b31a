"""One module per `agent` subcommand: each has `register(subparsers)` and a `run(args) -> int`."""
