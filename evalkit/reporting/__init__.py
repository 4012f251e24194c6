"""What a run found, computed from the ledger alone: tables per variant and slice, paired
comparisons with intervals, verdicts against margins, multiple-testing control, spikes and their
causes, capacity, cost, the gate for pipelines, pooled runs, and the HTML report with its plots.

May import: everything below it (root, `spec`, `ledger`, `engines`, `measure`, `grading`,
`execution`). Nothing here measures again.
"""
