"""Getting results out and in: Datasette over the ledger (metadata, canned queries, plugins),
publishing a run as a Hugging Face dataset, and importing other load tools' per-request results.

May import: everything but `cli`.
"""
