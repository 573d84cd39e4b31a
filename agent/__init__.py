"""kernelloop's agent: the loop, proposers, CLI, daemon and PR bot (agent/cli.py is the entry point)."""
