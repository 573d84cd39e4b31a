"""The agent loop: profile, propose, check, refine, commit, reload, verify.

    run_tune(settings, context)  -> final TuneState  (agent/loop/graph.py)
"""
