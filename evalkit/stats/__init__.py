"""Statistics evalkit's verdicts and tables rest on, with no I/O: descriptive figures
(percentiles, means, bootstrap and Wilson intervals), paired tests that can be inverted into the
interval they decide by (`signflip`: exact or Monte Carlo sign-flip tests of a mean difference or
a ratio of means; `robust`: the same joined with a studentized bootstrap, valid on skewed data and
stratified samples; `proportions`: paired pass rates against a non-zero margin), and Holm's
step-down with the level each step used (`multiplicity`), and accuracy against a baseline
(`accuracy`: recovery with a paired cluster bootstrap, McNemar's exact test, the minimum
detectable difference). Every simulation that proves a stated error rate calls these functions
(tests/test_verdict_boundary.py).

May import: nothing from evalkit (numpy and scipy only).
"""

from .accuracy import Recovery, mcnemar_exact, min_detectable_difference, recovery
from .describe import (
    Z_DETECT,
    bootstrap_ci,
    bootstrap_se,
    mean,
    min_detectable,
    pct_delta,
    percentile,
    time_weighted_mean,
    verdict,
    wilson,
)
from .multiplicity import holm, holm_level, pairs_for_a_verdict
from .proportions import PairedProportions
from .robust import BootstrapT, Robust, robust_mean, robust_ratio
from .signflip import PairedTest, SignFlipMean, SignFlipRatio, sign_flip_p

__all__ = [
    "Z_DETECT", "BootstrapT", "PairedProportions", "PairedTest", "Recovery", "Robust", "SignFlipMean", "SignFlipRatio",
    "bootstrap_ci", "bootstrap_se", "holm", "holm_level", "mcnemar_exact", "mean", "min_detectable",
    "min_detectable_difference", "pairs_for_a_verdict", "pct_delta", "percentile", "recovery", "robust_mean",
    "robust_ratio", "sign_flip_p", "time_weighted_mean", "verdict", "wilson",
]
