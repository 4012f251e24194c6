"""What a run is asked to do, read from the user's files: the matrix (variants, generation,
load options), the dataset (cases, conversations), traces, and the output JSON Schemas. Every
loader validates strictly and names file:line and field in its errors.

May import: the root modules (errors, paths, stats, redact, host). Nothing here does I/O beyond
reading input files.
"""
