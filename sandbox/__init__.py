"""Sandbox: built by a later issue (see docs/ARCHITECTURE.md)."""
