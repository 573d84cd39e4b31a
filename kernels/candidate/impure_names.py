"""Names a pure kernel never reaches: clocks, random generators torch owns, the process's environment,
process-wide settings, and the runtime state of caches and Triton kernels (purity.py's other half:
what is refused wherever it appears, as an attribute or an imported name).
"""

from __future__ import annotations

WHY = "kernels must be pure: a check's few calls must predict a server's many"

# Process state a kernel could branch on, written down once from torch 2.x's API surface: thread
# counts, grad/inference/autocast/determinism modes, compile/trace modes, a tensor's autograd state
# and where its memory came from (shared, pinned), and the CUDA allocator's and device's live figures.
ENVIRONMENT = frozenset({
    "get_num_threads", "get_num_interop_threads", "is_grad_enabled", "is_inference_mode_enabled", "is_inference",
    "is_autocast_enabled", "is_autocast_cpu_enabled", "is_autocast_cache_enabled", "is_autocast_ipu_enabled",
    "is_autocast_xla_enabled", "get_autocast_dtype", "get_autocast_gpu_dtype", "get_autocast_cpu_dtype",
    "get_autocast_ipu_dtype", "get_autocast_xla_dtype", "are_deterministic_algorithms_enabled",
    "is_deterministic_algorithms_warn_only_enabled", "get_deterministic_debug_mode", "use_deterministic_algorithms",
    "get_float32_matmul_precision", "is_anomaly_enabled", "is_anomaly_check_nan_enabled", "is_warn_always_enabled",
    "get_default_device", "get_default_dtype", "is_compiling", "is_dynamo_compiling", "is_exporting",
    "is_scripting", "is_tracing", "is_multithreading_enabled", "is_view_replay_enabled",
    "grad_fn", "is_leaf", "requires_grad", "retains_grad", "is_shared", "is_pinned",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
    "max_memory_cached", "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "memory_snapshot",
    "mem_get_info", "list_gpu_processes", "memory_usage", "host_memory_stats", "host_memory_stats_as_nested_dict",
    "utilization", "temperature", "power_draw", "clock_rate", "get_per_process_memory_fraction",
    "is_current_stream_capturing", "current_stream", "default_stream", "current_blas_handle",
    "current_solver_handle", "get_allocator_backend", "caching_allocator_alloc", "caching_allocator_delete",
    "empty_cache", "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
    "reset_accumulated_memory_stats", "get_sync_debug_mode", "is_initialized",
})
RANDOM = frozenset({
    "bernoulli", "bernoulli_", "multinomial", "randperm", "rand_like", "randn_like", "randint_like", "normal_",
    "uniform_", "random_", "exponential_", "geometric_", "log_normal_", "cauchy_", "manual_seed",
    "manual_seed_all", "initial_seed", "seed_all", "get_rng_state", "get_rng_state_all", "set_rng_state",
    "set_rng_state_all", "Generator", "default_generator", "fork_rng", "quasirandom", "SobolEngine",
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "native_dropout",
    "rrelu", "rrelu_", "gumbel_softmax",
})
RANDOM_IN_TORCH = frozenset({"rand", "randn", "randint", "normal", "poisson", "seed", "random"})
CLOCKS = frozenset({"do_bench", "do_bench_cudagraph", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns",
                    "process_time", "process_time_ns", "thread_time", "thread_time_ns", "time_ns", "elapsed_time"})
# Caches' and Triton kernels' state that grows or changes with the calls (an autotuner keeps the last
# call's arguments in .nargs and copies of its tensors in .restore_copies).
RUNTIME_STATE = frozenset({"cache_info", "cache_clear", "cache_parameters", "device_caches", "kernel_cache",
                           "best_config", "timings", "configs_timings", "bench_time", "nargs", "restore_copies"})
PREFIXES = {"triton.testing": "reads a clock", "torch.utils.benchmark": "reads a clock",
            "torch.profiler": "reads a clock", "torch.autograd.profiler": "reads a clock",
            "torch.random": "uses a random generator the op does not pass in",
            "torch.cuda.random": "uses a random generator the op does not pass in",
            "torch.cuda.memory": "reads the process's memory state"}
BACKEND_QUERIES = frozenset({"is_available", "is_built"})  # torch.backends.X.is_available(): a device query
PROCESS_DEPENDENT = frozenset({"hash", "id"})
IN_PLACE_OPERATORS = frozenset({"setitem", "delitem", "iadd", "iand", "iconcat", "ifloordiv", "ilshift", "imod",
                                "imul", "imatmul", "ior", "ipow", "irshift", "isub", "itruediv", "ixor"})


def reach_problem(attr: str, qualified: str | None, outermost: bool = True) -> str | None:
    """Why reading `.attr` (reached as `qualified` from an import, when known) is impure, or None."""
    torch_or_triton = qualified is not None and qualified.split(".")[0] in ("torch", "triton")
    if attr in RANDOM or (attr in RANDOM_IN_TORCH and qualified is not None and qualified.startswith("torch.")):
        return f".{attr} uses a random generator the op does not pass in ({WHY})"
    if attr in CLOCKS:
        return f".{attr} reads a clock ({WHY})"
    if attr in RUNTIME_STATE:
        return f".{attr} reads the runtime state of a cache or a kernel, which grows with the calls ({WHY})"
    if attr in ENVIRONMENT:
        return f".{attr} reads the process's environment (a kernel must not be able to tell the judge from a server)"
    if torch_or_triton and attr.startswith("set_"):
        return f"{qualified} changes process-wide state ({WHY})"
    if qualified is not None:
        if (qualified.startswith("torch.backends.") and outermost and attr not in BACKEND_QUERIES
                and qualified.count(".") >= 2):
            return f"{qualified} reads a process-wide torch setting (a kernel must not be able to tell the judge from a server)"
        for prefix, what in PREFIXES.items():
            if qualified == prefix or qualified.startswith(prefix + "."):
                return f"{prefix} {what} ({WHY})"
        if qualified.startswith("operator.") and attr in IN_PLACE_OPERATORS:
            return f"operator.{attr} changes its argument in place ({WHY})"
    return None
