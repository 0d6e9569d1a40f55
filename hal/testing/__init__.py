"""Helpers for tests and the conformance suite (multi-process worker pools)."""
from .worker_pool import Outcome, WorkerError, WorkerPool, free_port

__all__ = ["Outcome", "WorkerError", "WorkerPool", "free_port"]
