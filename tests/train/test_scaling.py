"""`rocmtrain scale`: its report (table, JSON, chart) from measurements, the sized jobs, and refusals (no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from PIL import Image

from rocmtrain_train.cli import scale_study as scale
from rocmtrain_train.cli.scaling_report import SizeResult, as_json, chart, markdown, scaling_rows
from train.jobs import QUICKSTART, job

# The seed blog's headline: 37 s on 2 GPUs, 20 s on 4.
SEED = [SizeResult(2, 37.0, 3.0, 100.0, 0.91), SizeResult(4, 20.0, 2.0, 185.0, 0.90)]


def test_speedup_and_efficiency_are_against_the_smallest_size():
    rows = scaling_rows(list(reversed(SEED)))
    assert [r.result.workers for r in rows] == [2, 4]
    assert rows[0].speedup == 1.0 and rows[0].efficiency == 1.0
    assert rows[1].speedup == pytest.approx(1.85) and rows[1].efficiency == pytest.approx(0.925)
    one = scaling_rows([SizeResult(1, 60.0), SizeResult(2, 40.0)])
    assert one[1].speedup == pytest.approx(1.5) and one[1].efficiency == pytest.approx(0.75)


def test_the_markdown_table():
    text = markdown(scaling_rows(SEED), "quickstart, locally")
    assert text.splitlines()[0] == (
        "quickstart, locally: speed-up and efficiency of the training time against 2 workers "
        "(the smallest size measured)."
    )
    assert "| 4 | 20.0 | 2.0 | 185.0 | 1.85x | 92% | 0.900 |" in text
    assert "| 1 | 60.0 | - | - | 1.00x | 100% | - |" in markdown(scaling_rows([SizeResult(1, 60.0)]), "t")
    assert as_json(scaling_rows(SEED))[1]["speedup"] == pytest.approx(1.85)


def test_the_chart_is_a_png(tmp_path: Path):
    chart(scaling_rows(SEED), tmp_path / "scaling.png", "seed")
    with Image.open(tmp_path / "scaling.png") as image:
        assert image.format == "PNG" and image.size[0] > 800


def test_results_read_a_run_summary_and_a_job_status():
    assert SizeResult.from_summary(2, {"train_seconds": 30.5, "eval_accuracy": 0.9}) == SizeResult(
        2, 30.5, None, None, 0.9
    )
    status = {"trainSeconds": 20.0, "evalSeconds": 1.5, "samplesPerSecond": 90.0, "evalAccuracy": 0.8}
    assert SizeResult.from_summary(4, status) == SizeResult(4, 20.0, 1.5, 90.0, 0.8)


def test_each_size_is_the_job_with_its_workers_from_scratch():
    base = job("a-very-long-job-name-that-fills-forty-ch")
    sized = scale.variant(base, 16, "local")
    assert sized.spec.resources.workers == 16 and sized.spec.checkpoint.resume == "never"
    assert sized.metadata.name == "a-very-long-job-name-that-fills-fort-w16"  # still at most 40 characters
    assert sized.spec.model == base.spec.model and sized.spec.data == base.spec.data


def test_bad_sizes_and_jobs_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        scale.main([str(QUICKSTART), "--workers", "two"])
    with pytest.raises(SystemExit):
        scale.main([str(QUICKSTART), "--workers", "0,1"])
    raw = yaml.safe_load(QUICKSTART.read_text())
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(raw))
    assert scale.main([str(tmp_path / "job.yaml"), "--workers", "1,2", "--cluster"]) == 2  # ./ paths: local only
    assert "a ./relative path is only for `rocmtrain run`" in capsys.readouterr().err
