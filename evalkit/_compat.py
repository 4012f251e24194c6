"""Old import paths, kept for one release (CHANGELOG.md): `evalkit.matrix` still imports, as the
module it became (`evalkit.spec.matrix`), with a DeprecationWarning naming the new path."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

MOVED = {
    "config": "spec.config", "dataset": "spec.dataset", "matrix": "spec.matrix", "output_schemas": "spec.output_schemas",
    "client": "measure.client", "timing": "measure.timing", "tokens": "measure.tokens", "telemetry": "measure.telemetry",
    "stub_server": "testing.stub_server", "load": "execution.load", "session": "execution.live",
    "sender": "execution.sender", "estimate": "execution.estimate", "progress": "execution.progress",
    "runner": "execution.runner", "cluster": "execution.cluster", "workflow": "execution.workflow",
    "report": "reporting.report", "findings": "reporting.findings", "gate": "reporting.gate",
    "html_report": "reporting.html", "svgplot": "reporting.svgplot", "browse": "sharing.browse",
    "publish": "sharing.publish",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        head, _, rest = fullname.partition(".")
        if head == "evalkit" and rest in MOVED:
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = "evalkit." + MOVED[spec.name.partition(".")[2]]
        warnings.warn(f"{spec.name} moved to {new}; the old path goes away in the next release",
                      DeprecationWarning, stacklevel=3)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its new name


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
