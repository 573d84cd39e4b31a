"""The judge's side of the sandbox (trusted): it plans, starts the confined processes, decides and times.

sandbox/__init__.py describes the two rooms; nothing here runs a candidate's code in this process."""
