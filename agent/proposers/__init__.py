"""Proposers: where candidate kernels come from (an LLM, a parameter sweep, ...)."""
