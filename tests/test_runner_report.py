import pytest

from vlctl.fsops import VlctlError
from vlctl.io import read_json
from vlctl.recipes.runner import Runner, find_stage
from vlctl.report.writer import Report


def test_stage_is_cached_by_key(tmp_path):
    calls = []

    def work(d):
        calls.append(d)
        (d / "out.txt").write_text("done")

    r = Runner(tmp_path)
    a = r.stage("s", {"x": 1}, work)
    b = Runner(tmp_path).stage("s", {"x": 1}, work)
    assert a == b and len(calls) == 1 and (a / "out.txt").read_text() == "done"
    c = r.stage("s", {"x": 2}, work)
    assert c != a and len(calls) == 2
    Runner(tmp_path, force=True).stage("s", {"x": 1}, work)
    assert len(calls) == 3
    assert read_json(a / "done.json", "marker")["key"] == {"x": 1}


def test_find_stage_takes_the_one_finished_stage_of_that_name(tmp_path):
    r = Runner(tmp_path)
    embed = r.stage("embed", {"x": 1}, lambda d: None)
    r.stage("embed-train", {"x": 1}, lambda d: None)  # a longer name with the same prefix
    (tmp_path / "stages" / "embed-0123456789ab.partial").mkdir()  # unfinished
    assert find_stage(tmp_path / "stages", "embed") == embed
    with pytest.raises(VlctlError, match="'data'"):
        find_stage(tmp_path / "stages", "data")
    r.stage("embed", {"x": 2}, lambda d: None)  # another config's stage beside it
    with pytest.raises(VlctlError, match="expected one finished 'embed' stage"):
        find_stage(tmp_path / "stages", "embed")


def test_failed_stage_is_not_marked_done_and_resumable_stage_resumes(tmp_path):
    seen = []

    def flaky(d, resume):
        seen.append(resume)
        if len(seen) == 1:
            raise RuntimeError("killed before its first checkpoint")
        (d / "run" / "checkpoint").mkdir(parents=True, exist_ok=True)
        (d / "run" / "checkpoint" / "state.json").write_text("{}")
        if len(seen) == 2:
            raise RuntimeError("interrupted after a checkpoint")

    import pytest

    for _ in range(2):
        with pytest.raises(RuntimeError):
            Runner(tmp_path).stage("train", {"k": 1}, flaky, resumable=True)
        assert all(p.name.endswith(".partial") for p in (tmp_path / "stages").iterdir())
    d = Runner(tmp_path).stage("train", {"k": 1}, flaky, resumable=True)
    # an empty .partial (killed before any checkpoint) starts afresh; one with a checkpoint resumes
    assert seen == [False, False, True] and (d / "done.json").is_file()


def test_report_renders_tables_and_figures(tmp_path):
    rep = Report("T")
    rep.heading("H")
    rep.table(["a", "b"], [["x", 1.234], ["y", None]])
    rep.figure("figures/f.png", "cap <1>")
    rep.write(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "| x | 1.2 |" in md and "| y | – |" in md and "![cap <1>](figures/f.png)" in md
    html = (tmp_path / "report.html").read_text()
    assert "<td>1.2</td>" in html and "cap &lt;1&gt;" in html


def test_stages_say_when_they_start_end_and_are_reused(tmp_path, capsys):
    r = Runner(tmp_path)
    r.stage("train", {"x": 1}, lambda d: None)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[vlctl] stage train: started" and lines[1].startswith("[vlctl] stage train: done in ")
    Runner(tmp_path).stage("train", {"x": 1}, lambda d: None)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("[vlctl] stage train: reused ") and "computed in" in line
    Runner(tmp_path, verbose=False).stage("train", {"x": 2}, lambda d: None)
    assert capsys.readouterr().err == ""


def test_each_stage_records_its_cpu_time_peak_memory_and_bytes_written(tmp_path):
    """What the scale rehearsal reads per stage (benchmarks/rehearsal/): the peak RSS is the stage's own
    (reset at its start), so a small stage after a big one does not inherit the big one's peak."""
    import numpy as np

    def big(d):
        a = np.ones(400 * 2**20 // 8)  # 400 MiB, touched
        (d / "a.npy").write_bytes(a[: 2**20 // 8].tobytes())  # 1 MiB written

    r = Runner(tmp_path)
    r.stage("big", {}, big)
    r.stage("small", {}, lambda d: None)
    with r.measure("evaluate"):
        sum(range(10**6))
    b, s, e = r.timings["big"], r.timings["small"], r.timings["evaluate"]
    assert b["peak_rss_bytes"] > 400 * 2**20 and s["peak_rss_bytes"] < b["peak_rss_bytes"] - 300 * 2**20
    assert b["written_bytes"] >= 2**20 and b["cpu_seconds"] > 0 and b["cached"] is False
    assert e["cached"] is False and e["seconds"] > 0 and e["cpu_seconds"] > 0
    again = Runner(tmp_path)
    again.stage("big", {}, big)
    assert again.timings["big"]["cached"] is True and "peak_rss_bytes" not in again.timings["big"]
