"""Statistics evalkit's verdicts and tables rest on, with no I/O: descriptive figures
(percentiles, means, bootstrap and Wilson intervals), paired tests that can be inverted into the
interval they decide by (`signflip`: exact or Monte Carlo sign-flip tests of a mean difference or
a ratio of means; `proportions`: paired pass rates against a non-zero margin), and Holm's
step-down with the level each step used (`multiplicity`). Every simulation that proves a
stated error rate calls these functions (tests/test_verdict_boundary.py).

May import: nothing from evalkit (numpy and scipy only).
"""

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
from .signflip import PairedTest, SignFlipMean, SignFlipRatio, sign_flip_p

__all__ = [
    "Z_DETECT", "PairedProportions", "PairedTest", "SignFlipMean", "SignFlipRatio", "bootstrap_ci", "bootstrap_se",
    "holm", "holm_level", "mean", "min_detectable", "pairs_for_a_verdict", "pct_delta", "percentile", "sign_flip_p",
    "time_weighted_mean", "verdict", "wilson",
]
