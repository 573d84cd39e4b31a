"""What runs confined: the sandboxed processes' code (worker, trace, replay, capture), their Python guards
and their OS confinement. Nothing here imports the judge's side (sandbox/judge/).

sandbox/__init__.py describes the two rooms."""
