"""Plumbing every layer shares: the errors a user can act on (`errors`), where kernelloop keeps its files
(`paths`), progress messages (`progress`), the judges' intervals (`stats`) and the profile's typed contract
(`profile_contract`). Any layer (kernels, engine, profiler, sandbox, history, agent) may import it, and it
imports none of them: no op, engine, sandbox or agent logic belongs here, only what several layers need
and none of them owns. Its modules stay light (no torch, no Triton), so `--help` and the errors load
without them.
"""
