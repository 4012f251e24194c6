"""Errors raised by the evalkit library; the CLI maps them to exit codes (never sys.exit here)."""

from __future__ import annotations


class EvalkitError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class UsageError(EvalkitError):
    """Bad input from the user: a file, a flag, a value. Exit code 2."""

    exit_code = 2


class DatasetError(UsageError):
    """A dataset file or row is invalid (message names file:line and field)."""


class SuiteError(DatasetError):
    """A suite spec (`instructions,gsm8k:FILE`) or a suite's file is invalid (message names
    file:line and field, or the known suite names)."""


class MatrixError(UsageError):
    """A matrix file is invalid (message names file:line and field)."""


class RubricError(UsageError):
    """A rubric or schema file is invalid."""


class PluginError(UsageError):
    """A grader plugin's hook raised: one line naming the grader and the hook (exit code 2)."""


class LedgerError(UsageError):
    """The ledger file is not an evalkit ledger, or is from a newer schema."""


class OldLedgerSchema(LedgerError):
    """A ledger opened read-only lacks migrations this evalkit applies: read it through a migrated copy."""


class LedgerWriteError(EvalkitError):
    """A write to the ledger failed (a full disk, a read-only file): the run stops, resumable."""

    run_id: str | None = None


class EngineError(EvalkitError):
    """A serving engine failed to prepare, start or answer. Runtime failure, exit code 1."""


class EndpointError(EngineError):
    """An endpoint could not be reached or answered badly."""


class GradingIncomplete(EvalkitError):
    """A grader raised on some requests: their error grades are in the ledger, every other request
    is graded, and `evalkit grade --retry-failed` grades them again. Exit code 1."""
