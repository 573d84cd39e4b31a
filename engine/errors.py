"""Engine errors a user can act on: the CLI prints one line, the server answers with a 4xx."""

from kernelloop.common.errors import KernelloopError


class EngineError(KernelloopError):
    pass


class ModelLoadError(EngineError):
    """The model directory is missing, unsupported or inconsistent."""
