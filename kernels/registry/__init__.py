"""The git-backed kernel registry: manifest, integrity-checked loading, selection, rollback."""

from kernelloop.kernels.registry.entry import ANY_BUCKET, Entry, Provenance, select_entry
from kernelloop.kernels.registry.store import Commit, Registry, default_registry_path

__all__ = ["ANY_BUCKET", "Commit", "Entry", "Provenance", "Registry", "default_registry_path", "select_entry"]
