"""Fit the formality estimators from the tune file alone (protocol: rubrics/formality.md).

    .venv/bin/python rubrics/fit_formality.py split    # once: labelled -> tune + test (seeded, stratified)
    .venv/bin/python rubrics/fit_formality.py fit      # lexicon, weights, thresholds, classifier from tune
    .venv/bin/python rubrics/fit_formality.py check    # the committed files are what `fit` makes
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from evalkit.grading.formality_fit import fit_all, same_fit, write_split  # noqa: E402


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else ""
    if cmd == "split":
        tune, test = write_split(HERE)
        print(f"tune {tune} texts, test {test} texts")
    elif cmd in ("fit", "check"):
        files = fit_all(HERE)
        stale = [name for name, text in files.items()
                 if not (HERE / name).exists() or not same_fit(name, (HERE / name).read_text(encoding="utf-8"), text)]
        if cmd == "check":
            print("up to date" if not stale else f"stale: {', '.join(stale)}")
            return 1 if stale else 0
        for name, text in files.items():
            (HERE / name).write_text(text, encoding="utf-8")
        print("wrote " + ", ".join(files))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
