"""The SGLang-style inference engine: model, paged KV cache, radix prefix cache, continuous
batching scheduler, sampler and the OpenAI-compatible server (see docs/ARCHITECTURE.md)."""
