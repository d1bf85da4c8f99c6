"""The package's errors: one base class, each subclass with the exit code the `llama-tq` command returns for it.

Exit codes (documented in `llama-tq --help` and the README):
  0  success
  1  the work ran but a result failed: a broken or INVALID run, a missed target, a series that does not apply
  2  bad input: arguments, configs, the measurement protocol, missing files or model
  3  the environment: a tool or library missing, the pinned base unobtainable, pip failing
"""

from __future__ import annotations

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_ENV = 0, 1, 2, 3


class LlamaTqError(Exception):
    """Base of every error llama-tq raises on purpose; `exit_code` is what the CLI returns for it."""

    exit_code = EXIT_USAGE


class UsageError(LlamaTqError, ValueError):
    """Bad arguments or settings (unknown cache type, position, option...)."""


class ProtocolError(UsageError):
    """A run that would not meet the measurement protocol."""


class ModelError(LlamaTqError):
    """The model is missing or cannot be read."""


class ToolError(LlamaTqError):
    """A patched llama.cpp tool or library is missing or could not run."""

    exit_code = EXIT_ENV


class RunError(LlamaTqError):
    """A tool ran and failed in a way that leaves no result (e.g. the f16 base run of a KLD matrix)."""

    exit_code = EXIT_FAILED


class BaseError(LlamaTqError):
    """The pinned base could not be obtained or verified."""

    exit_code = EXIT_ENV


class PatchError(LlamaTqError):
    """The series cannot be applied or reverted; the tree was not changed."""

    exit_code = EXIT_FAILED
