"""Bundled model cache: a copy made by an older recipe is made anew; a current one is reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.engines import bundled


@pytest.fixture
def fake_prepare(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Preparation without llmcompressor: each step just creates its output folder."""
    calls: list[str] = []

    def run(cmd: list[str], log: Path) -> None:
        calls.append(cmd[2])
        out = Path(cmd[3] if cmd[2] == "bf16" else cmd[4])
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(bundled, "_run", run)
    monkeypatch.setattr(bundled, "quant_python", lambda: "python")
    return calls


def test_a_w8a8_from_an_older_recipe_is_prepared_again(tmp_path, fake_prepare):
    for name in (bundled.BF16, bundled.W8A8):
        (tmp_path / name).mkdir()
        (tmp_path / name / bundled.READY).write_text("prepared in 11.0 s\n")  # recipe 1, unrecorded
    said: list[str] = []
    out = bundled._prepare(bundled.W8A8, tmp_path, said.append)
    assert fake_prepare == ["w8a8"]  # the bf16 source (recipe 1) is current and reused
    assert bundled._recipe_of(out) == bundled.RECIPES[bundled.W8A8] == 2
    assert any("W8A8" in s for s in said)
    assert (out / "config.json").exists()
    bundled._prepare(bundled.W8A8, tmp_path, said.append)
    assert fake_prepare == ["w8a8"]  # now current: reused
