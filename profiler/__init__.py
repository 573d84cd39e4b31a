"""Profiler: where an engine's time goes, per op of the op library and for everything else.

    profile_engine(engine, workload)   in-process (profiler/inprocess.py)
    profile_url(url, workload)         a running engine over HTTP (profiler/http.py)
    agent_workload(n, seed)            the built-in agent-shaped workload (profiler/workload.py)

Both return the profile dict documented in profiler/profile.py.
"""
