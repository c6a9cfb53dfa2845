"""The per-run HTML report (`eval.py report`, infra/report.py) and the validation samples train.py keeps for it
(infra/samples.py): read back by parsing the HTML with the standard library's parser, not by string search."""
import errno
import json
import os
import shutil
from html.parser import HTMLParser

import pytest

import eval as E
import tasks
import train
import workflows
from infra import report, report_warnings, samples

TINY = ["--model", "tiny", "--workflow", "voting", "--policy", "sp", "--tasks-per-step", "3", "--n", "2",
        "--max-new-tokens", "16", "--lr", "1e-2", "--warmup-steps", "1", "--n-train", "12", "--n-val", "3",
        "--val-n", "2", "--val-every", "1", "--val-samples", "2", "--save-every", "1", "--steps", "2"]
ROLE_CURVES = ["val/{r}/response_len", "{r}/response_len", "val/{r}/format_ok", "{r}/format_ok", "val/{r}/acc",
               "{r}/acc", "{r}/entropy", "{r}/grad_norm", "{r}/loss_share", "{r}/grad_norm_share", "{r}/opt_steps"]


def parity_reward(monkeypatch):
    """A random tiny model never boxes a right answer: a learnable stand-in reward (even-length outputs win), so
    that advantages, gradients and shares are not all 0 (as tests/test_train.py's PARITY_TRAIN)."""
    monkeypatch.setattr(workflows, "grade_many", lambda ts, outs: [
        tasks.Grade(float(len(o) % 2 == 0), o[:8], True, "parity") for o in outs])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    parity_reward(mp)
    run_dir = str(tmp_path_factory.mktemp("report") / "voting-sp")
    try:
        train.main([*TINY, "--run-dir", run_dir])
    finally:
        mp.undo()
    out = os.path.join(os.path.dirname(run_dir), "report.html")
    E.main(["report", run_dir, "--out", out])
    with open(out, encoding="utf-8") as f:
        return run_dir, Page(f.read())


class Page(HTMLParser):
    """What the report holds: its curves (polyline data-key: number of points), its warnings, every link and
    source, and every sampled call's cell: (task, sample, call@turn, step) -> {"output", "prompt", "meta"}."""

    def __init__(self, text: str):
        super().__init__()
        self.curves, self.warnings, self.links, self.ids, self.cells = {}, [], [], set(), {}
        self.task = self.row = self.cell = self.pre = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.ids |= {a["id"]} if "id" in a else set()
        self.links += [(tag, name, value) for name, value in attrs if name in ("src", "href")]
        if tag == "polyline":
            self.curves[a["data-key"]] = len(a["points"].split())
        elif tag == "li" and "warn" in a.get("class", ""):
            self.warnings.append((a["data-kind"], a["data-role"] or None))
        elif tag == "div" and a.get("class") == "task":
            self.task = (a["data-task"], int(a["data-sample"]))
        elif tag == "tr":
            self.row = a.get("data-call")
        elif tag == "td" and self.row and "data-step" in a:
            self.cell = self.cells.setdefault((*self.task, self.row, int(a["data-step"])),
                                              {"output": "", "prompt": "", "meta": ""})
        elif tag == "pre" and self.cell is not None:
            self.pre = "output" if a.get("class") == "out" else "prompt"
        elif tag == "div" and a.get("class") == "meta" and self.cell is not None:
            self.pre = "meta"

    def handle_endtag(self, tag):
        if tag in ("pre", "div") and self.pre:
            self.pre = None
        elif tag == "td":
            self.cell = None

    def handle_data(self, data):
        if self.pre and self.cell is not None:
            self.cell[self.pre] += data


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_the_run_keeps_the_same_validation_tasks_at_every_validation_step(tiny_run):
    run_dir, _ = tiny_run
    kept = samples.read_samples(run_dir)
    assert sorted(kept) == [0, 1, 2]  # step 0 (the base model) and every validation step
    for step, episodes in kept.items():
        assert [(e["task"]["id"], e["sample"]) for e in episodes] == [
            ("arith-d0-val-00000", 0), ("arith-d0-val-00000", 1), ("arith-d0-val-00001", 0),
            ("arith-d0-val-00001", 1)], step  # --val-samples 2 tasks x --val-n 2, of the 3 validation tasks
        for e in episodes:
            assert [c["name"] for c in e["calls"]] == ["generator0", "generator1", "generator2", "aggregator"]
            for c in e["calls"]:
                assert {"role", "adapter", "messages", "output", "parsed", "correct", "reward"} <= set(c)
                assert c["adapter"] == "shared" and c["messages"][-1]["role"] == "user"


def test_the_report_holds_every_roles_curves_and_every_sampled_call(tiny_run):
    run_dir, page = tiny_run
    metrics = read_metrics(run_dir)
    for role in ("generator", "aggregator"):
        for key in (k.format(r=role) for k in ROLE_CURVES):
            assert page.curves.get(key) == sum(m.get(key) is not None for m in metrics), key  # one point per step
    assert page.curves["val/success"] == 3 and page.curves["success"] == 2
    assert set(page.curves) <= {k for m in metrics for k in m}  # no curve the run did not log
    kept = samples.read_samples(run_dir)
    acc = {m["step"]: m["val/success"] for m in metrics}
    best = max(sorted(kept), key=lambda s: (acc[s], -s))
    shown = {0, best, 2}  # the first, the best and the last validation step
    assert {key[3] for key in page.cells} == shown
    expected = {(e["task"]["id"], e["sample"], f"{c['name']}@{c['turn']}", step): c
                for step in shown for e in kept[step] for c in e["calls"]}
    assert set(page.cells) == set(expected)
    for key, c in expected.items():
        cell = page.cells[key]
        assert cell["output"] == c["output"], key
        assert c["messages"][-1]["content"] in cell["prompt"]
        assert f"reward {c['reward']:g}" in cell["meta"] and f"adapter {c['adapter']}" in cell["meta"]


def outside_links(page):
    """Every src or href that is not a link to a place on the page itself."""
    return [value for _, _, value in page.links if "http" in value or not value.startswith("#")]


def test_the_report_loads_nothing_from_the_network(tiny_run):
    _, page = tiny_run
    assert len(page.links) >= 2  # the warnings' links: the check below has something to check
    assert outside_links(page) == []
    assert {value[1:] for _, _, value in page.links} <= page.ids  # every link lands on the page
    planted = Page('<a href="#x">a</a><img src="http://example.org/a.png"><script src="//cdn/x.js"></script>')
    assert outside_links(planted) == ["http://example.org/a.png", "//cdn/x.js"]  # the check can fail


def write_run(folder, metrics, workflow="voting", policy="sp"):
    os.makedirs(folder)
    args = {"model": "toy", "task": "math", "data": None, "difficulty": 0, "workflow": workflow, "policy": policy}
    with open(os.path.join(folder, "args.json"), "w") as f:
        json.dump(args, f)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(m) + "\n" for m in metrics)
    return str(folder)


def planted(length_at_20=25.0, aggregator_format_at_20=0.3, grad_at_15=0.5, val_at_15=0.5):
    """21 steps of a steady Voting-SP run, validated every 5 steps, with what the arguments plant."""
    metrics = []
    for step in range(21):
        m = {"step": step}
        if step > 0:
            for role in ("generator", "aggregator"):
                noise = 0.01 * (step % 3)  # not flat: a median of constant values would hide a bug
                m.update({f"{role}/grad_norm": 0.5 + noise, f"{role}/entropy": 1.0 + noise,
                          f"{role}/response_len": 10.0 + noise, f"{role}/format_ok": 1.0})
            m["generator/grad_norm"] = grad_at_15 if step == 15 else m["generator/grad_norm"]
        if step % 5 == 0:
            m.update({"val/success": val_at_15 if step == 15 else 0.5, "val/generator/format_ok": 1.0,
                      "val/generator/response_len": length_at_20 if step == 20 else 10.0,
                      "val/aggregator/response_len": 8.0,
                      "val/aggregator/format_ok": aggregator_format_at_20 if step == 20 else 1.0})
        metrics.append(m)
    return metrics


def test_a_planted_length_jump_and_format_collapse_raise_exactly_their_warnings(tmp_path):
    run_dir = write_run(tmp_path / "run", planted())
    out = str(tmp_path / "r.html")
    written = report.write_report([run_dir], out)
    assert [(w["kind"], w["role"], w["step"]) for w in written["warnings"][0]] == [
        ("length", "generator", 20), ("format", "aggregator", 20)]
    with open(out, encoding="utf-8") as f:
        page = Page(f.read())
    assert page.warnings == [("length", "generator"), ("format", "aggregator")]
    assert {"#r0-len", "#r0-format", "#r0-episodes"} <= {v for _, _, v in page.links}
    assert {"r0-len", "r0-format", "r0-episodes"} <= page.ids


def test_each_warning_fires_at_its_threshold_and_not_below_it():
    roles = ["generator", "aggregator"]
    quiet = planted(length_at_20=15.0, aggregator_format_at_20=0.8)  # x1.5 and the format threshold: no warning
    assert report_warnings.role_warnings(quiet, roles) == []
    assert [w["kind"] for w in report_warnings.role_warnings(planted(length_at_20=4.9, aggregator_format_at_20=1.0),
                                                    roles)] == ["length"]  # shrank by more than half
    loud = planted(length_at_20=10.0, aggregator_format_at_20=1.0, grad_at_15=2.0, val_at_15=0.3)
    assert [(w["kind"], w["role"], w["step"]) for w in report_warnings.role_warnings(loud, roles)] == [
        ("grad_norm jump", "generator", 15), ("validation drop", None, 15)]
    assert report_warnings.role_warnings(planted(length_at_20=10.0, aggregator_format_at_20=1.0, grad_at_15=1.4,
                                        val_at_15=0.46), roles) == []  # under x3 the median, and a drop of 0.04


def test_several_runs_go_side_by_side_with_one_chart_row_each(tmp_path):
    sp = write_run(tmp_path / "sp", planted())
    ip = write_run(tmp_path / "ip", planted(length_at_20=10.0, aggregator_format_at_20=1.0), policy="ip")
    written = report.write_report([sp, ip], str(tmp_path / "r.html"))
    assert written["runs"] == ["Voting-SP-Toy-Math", "Voting-IP-Toy-Math"]
    assert [len(w) for w in written["warnings"]] == [2, 0]
    with open(tmp_path / "r.html", encoding="utf-8") as f:
        page = Page(f.read())
    assert {"r0-len", "r1-len", "r0-episodes", "r1-episodes"} <= page.ids


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    run_dir = write_run(tmp_path / "run", planted())
    out = tmp_path / "r.html"
    for argv, message in [(["report", str(tmp_path / "nothing"), "--out", str(out)], "not a run folder"),
                          (["report", run_dir, "--out", str(tmp_path)], "expected a file"),
                          (["report", run_dir, "--out", os.path.join(run_dir, "args.json", "r.html")],
                           "cannot write there")]:
        with pytest.raises(SystemExit) as e:
            E.main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()
    os.makedirs(os.path.join(run_dir, "samples"))
    with open(os.path.join(run_dir, "samples", "step_000000.json"), "w") as f:
        f.write("{cut")
    with pytest.raises(SystemExit):
        E.main(["report", run_dir, "--out", str(out)])
    assert "unreadable validation samples" in capsys.readouterr().err and not out.exists()


def test_a_resumed_run_writes_the_same_samples_and_drops_later_ones(tiny_run, tmp_path, monkeypatch):
    """Step 2 redone from step 1's checkpoint writes the same samples file; a later step's file, stale after the
    resume, is removed (as metrics.jsonl is cut at the checkpoint)."""
    run_dir, _ = tiny_run
    cut = str(tmp_path / "cut")
    shutil.copytree(run_dir, cut)
    shutil.rmtree(os.path.join(cut, "checkpoints", "step_000002"))
    with open(os.path.join(cut, "samples", "step_000009.json"), "w") as f:
        json.dump({"step": 9, "episodes": []}, f)
    os.remove(os.path.join(cut, "samples", "step_000002.json"))
    parity_reward(monkeypatch)
    train.main(["--resume", cut])
    assert sorted(os.listdir(os.path.join(cut, "samples"))) == [f"step_00000{s}.json" for s in (0, 1, 2)]
    assert samples.read_samples(cut) == samples.read_samples(run_dir)


def test_a_samples_file_that_cannot_be_written_ends_in_one_line(tmp_path, monkeypatch, capsys):
    """The step-2 samples file cannot be written (a full disk, patched): one line naming the file and why, the last
    good checkpoint and the resume command; the resumed run writes it."""
    real = samples.write_samples

    def full_disk(run_dir, step, records):
        if step == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(run_dir, step, records)
    monkeypatch.setattr(samples, "write_samples", full_disk)
    run_dir = str(tmp_path / "run")
    with pytest.raises(SystemExit) as stop:
        train.main([*TINY, "--run-dir", run_dir])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 1 and err[-1] == (
        "error: could not write RUN/samples/step_000002.json: the disk is full; the last good checkpoint is step 1; "
        f"once it can be written, continue with: python train.py --resume {run_dir}")
    monkeypatch.setattr(samples, "write_samples", real)
    train.main(["--resume", run_dir])
    assert sorted(samples.read_samples(run_dir)) == [0, 1, 2]
