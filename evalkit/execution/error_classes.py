"""The error classes `--resume --retry-failed` sends again by default: a module of its own, with
no imports, so the command line can name them in its help without loading the runner."""

from __future__ import annotations

# the error classes a server going away causes
DEFAULT_RETRY_CLASSES = ("connect_error", "stream_cut", "server_error", "http_5xx", "not_sent", "timeout",
                         "client_died")  # client_died: its sending process died with it in hand (execution/procs.py)
