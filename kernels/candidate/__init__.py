"""What a candidate module is allowed to be, and how one is loaded: shared by the sandbox that judges
candidates and the registry loader that serves them, so the code that runs in the engine is loaded
exactly as the code that was judged.

- `static_check.py`: the static rules a candidate's source must pass (standard library only), with
  `source_text.py` (the text reads as it runs), `privilege.py` and `passing.py` (who may read private
  attributes and write attributes), `purity.py` and `impure_names.py` (no state after import, no
  clock, randomness or environment) and `tree_facts.py` (what they share about the parsed module).
- `guarded_builtins.py`: the builtins a candidate module runs with (import allowlist, inert logging,
  functools caches that keep no tensor).
- `canonical.py`: the one text that runs (what Triton rebuilds kernels from reads as the AST does).
- `loader.py`: the one way a candidate module is executed, by the judge's runner and the engine, with
  `runtime_purity.py` (its state frozen after import and checked after every call).
"""
