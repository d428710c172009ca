"""benchmarks/davis_cv.py: the cross-validated DAVIS figure chooses on three folds and reports on the fourth, so a
candidate that is only good on the sequences that chose it does not raise the figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import davis_cv
from davis_data import DEV_SPLIT, FOLDS


def _write(path: Path, j_of) -> Path:
    per = {
        mode: {s: {"J": j_of(s), "wrong": 0.0 if j_of(s) >= 0.6 else 0.1} for s in DEV_SPLIT}
        for mode in ("click", "box")
    }
    path.write_text(json.dumps({"per_sequence": {"new": per}, "params": []}))
    return path


def test_the_folds_partition_the_dev_split():
    assert [len(f) for f in FOLDS] == [10, 10, 10, 10]
    assert sorted(s for f in FOLDS for s in f) == sorted(DEV_SPLIT)


def test_a_candidate_fitted_to_one_fold_does_not_raise_the_cross_validated_figure(tmp_path, capsys):
    steady = _write(tmp_path / "steady.json", lambda s: 0.6)
    lucky = _write(tmp_path / "lucky.json", lambda s: 0.95 if s in FOLDS[0] else 0.5)
    summary = tmp_path / "cv.json"
    assert davis_cv.main([str(steady), str(lucky), "--json", str(summary)]) == 0
    out = json.loads(summary.read_text())
    # on all 40 the lucky candidate looks best: 0.6125 against 0.6
    assert out["all_dev_choice"] == "lucky"
    assert out["modes"]["click"]["all_dev_J"] == pytest.approx(0.6125)
    # held out, fold 0 is judged by the folds that do not flatter lucky (steady chosen), folds 1-3 by folds that
    # include fold 0 (lucky chosen, 0.5 there): (10 x 0.6 + 30 x 0.5) / 40
    assert [f["chosen"] for f in out["folds"]] == ["steady", "lucky", "lucky", "lucky"]
    assert out["modes"]["click"]["cv_J"] == pytest.approx(0.525)
    assert out["modes"]["box"]["cv_wrong"] == pytest.approx(0.075)
    assert "fold 0: chose steady" in capsys.readouterr().out


def test_one_candidate_gives_the_all_dev_figure(tmp_path):
    only = _write(tmp_path / "only.json", lambda s: 0.4 + 0.01 * sorted(DEV_SPLIT).index(s))
    out = davis_cv.cross_validate({"only": davis_cv.load_candidate(only)})
    assert out["modes"]["click"]["cv_J"] == pytest.approx(out["modes"]["click"]["all_dev_J"])


def test_a_partial_run_is_refused(tmp_path):
    path = tmp_path / "part.json"
    path.write_text(json.dumps({"per_sequence": {"new": {"click": {"bear": {"J": 1.0, "wrong": 0.0}}}}}))
    with pytest.raises(SystemExit, match="lacks 39 dev sequences"):
        davis_cv.load_candidate(path)
