"""The agent loop: profile, propose, check, refine, commit, reload, verify (issue #6).

    run_tune(settings, context)  -> final TuneState  (agent/loop/graph.py)
"""
