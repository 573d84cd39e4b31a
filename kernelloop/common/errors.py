"""Errors a user can act on. The CLI prints their message as one line and exits 2."""


class KernelloopError(Exception):
    """Base class: the message is complete and meant for the user."""


class UnknownOpError(KernelloopError):
    pass


class UnknownDtypeError(KernelloopError, ValueError):
    pass


class RegistryError(KernelloopError):
    """The registry cannot be read or written; baselines keep working."""
