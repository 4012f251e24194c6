"""Running a matrix: load planning (modes, sweeps, schedules, traces), a variant's life (launch,
watch, stop), sending requests and writing each to the ledger as it finishes, the duration
estimate and run sizing, progress, signals, resume, several client processes, and Ray.

May import: the root modules, `spec`, `ledger`, `engines`, `measure`, `grading` (to grade what a
run produced). Never imported by `grading`.
"""
