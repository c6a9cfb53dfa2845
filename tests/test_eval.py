"""Evaluation: pass@k by hand, mode routing and per-role regrading with a scripted engine, trajectory dumps,
--every-checkpoint on real tiny runs, and the plot command's figures."""
import json
import math
import os
import shutil

import pytest
import torch
from test_flags import train_flags
from test_workflows import TOK, ScriptedEngine  # the scripted engine: canned outputs per role, no model

import eval as E
import train
from infra import runfolder
from infra.cells import cell_name
from infra.flags import settings_from
from policies import chat_encoder
from tasks import Task
from workflows import WorkflowOptions, rollout

TASK = Task("t1", "What is 2 + 2?", "4", "math")


# ---------------------------------------------------------------- pass@k

@pytest.mark.parametrize("c,k,expected", [
    (0, 1, 0.0), (0, 2, 0.0), (0, 4, 0.0),
    (1, 1, 0.25), (1, 2, 0.5), (1, 4, 1.0),   # 1 - C(3,k)/C(4,k): 1 - 3/4, 1 - 3/6, 1 - 0/1
    (4, 1, 1.0), (4, 2, 1.0), (4, 4, 1.0),
])
def test_pass_at_k_hand_worked(c, k, expected):
    assert E.pass_at_k(4, c, k) == pytest.approx(expected)
    assert E.pass_at_k(4, c, k) == pytest.approx(1 - math.comb(4 - c, k) / math.comb(4, k))  # closed form


def test_pass_at_k_metrics_average_tasks_and_stop_at_n():
    from workflows import Episode
    tasks = [Task("a", "q", "1", "math"), Task("b", "q", "1", "math")]
    eps = []
    for task, pattern in zip(tasks, ([True, False, False, False], [True] * 4)):  # c = 1 and c = 4 of n = 4
        for k, ok in enumerate(pattern):
            eps.append(Episode(task, k, reward=float(ok)))
    m = E.evaluation_metrics(eps)
    assert {k: v for k, v in m.items() if k.startswith("pass@")} == \
        pytest.approx({"pass@1": (0.25 + 1) / 2, "pass@2": (0.5 + 1) / 2, "pass@4": 1.0})
    # added over two halves (two ranks, one task each), the tallies give the same numbers
    halves = E.add_tallies([E.evaluation_tallies(eps[:4]), E.evaluation_tallies(eps[4:])])
    assert E.evaluation_metrics(halves) == pytest.approx(m)


def test_cell_and_dataset_names():
    base = dict(workflow="voting", policy="ip", model="smollm2", task="math", difficulty=0, data=None)
    assert cell_name(base) == "Voting-IP-SmolLM2-Math"
    assert cell_name({**base, "workflow": "evalopt", "policy": "sp", "model": "Qwen/Qwen3-1.7B", "task": "dapo"}) \
        == "EvalOpt-SP-1.7B-Math"
    assert cell_name({**base, "workflow": "orchworkers", "model": "tiny", "task": "code"}) == \
        "OrchWorkers-IP-Tiny-Code"
    assert cell_name({**base, "workflow": "single", "model": "Qwen/Qwen3-0.6B"}) == "Single-IP-0.6B-Math"
    assert runfolder.dataset_name(base) == "math-d0"
    assert runfolder.dataset_name({**base, "task": "code"}) == "humaneval"
    assert runfolder.dataset_name({**base, "task": "dapo", "data": "data/dapo_test.jsonl"}) == "dapo_test"
    assert runfolder.dataset_name({**base, "task": "dapo", "data": "open-r1/DAPO-Math-17k-Processed"}) == \
        "DAPO-Math-17k-Processed"


# ---------------------------------------------------------------- routing and regrading (scripted engine)

def play(workflow: str, n: int, engine, route, policy: str = "ip") -> list:
    """`n` episodes of TASK with train.py's default options for `workflow`, as evaluation runs them."""
    args = vars(train_flags(["--workflow", workflow, "--policy", policy]))
    options = settings_from(WorkflowOptions, args)
    return rollout([TASK], n, options, engine, chat_encoder(TOK), route)


SCRIPTS = {
    "voting": {"generator": lambda p: "\\boxed{4}", "aggregator": lambda p: "\\boxed{1}"},
    "evalopt": {"generator": lambda p: "\\boxed{3}", "refine": lambda p: "\\boxed{4}",
                "evaluator": lambda p: "\\boxed{Incorrect}"},
    "orchworkers": {"orchestrator": lambda p: "STRATEGY 1: a\nSTRATEGY 2: b", "worker": lambda p: "\\boxed{4}",
                    "synthesizer": lambda p: "\\boxed{4}"},
}


@pytest.mark.parametrize("workflow", ["voting", "evalopt", "orchworkers"])
@pytest.mark.parametrize("policy", ["sp", "ip"])
def test_modes_route_adapters(workflow, policy):
    routed = {}
    for mode in E.MODES if policy == "ip" else [m for m in E.MODES if m != "swapped"]:  # swapped: IP only
        engine = ScriptedEngine(SCRIPTS[workflow])
        swap = E.swap_pair({"workflow": workflow, "policy": "ip"}, None)  # the default pair
        eps = play(workflow, 2, engine, E.mode_route(mode, policy, swap), policy)
        routed[mode] = {(c.role, c.adapter) for e in eps for c in e.calls}
        assert {a for _, a in routed[mode]} == {a for _, a in engine.calls}
    if policy == "ip":  # the pair's roles on each other's adapter, any third role (orchestrator) on its own
        a, b = E.swap_pair({"workflow": workflow, "policy": "ip"}, None)
        assert routed["swapped"] == {(r, {a: b, b: a}.get(r, r)) for r, _ in routed["trained"]}
    assert {a for _, a in routed["sa-transfer"]} == {"sa"}    # one adapter for every role of the workflow
    solving = {"generator", "worker"}                           # the SA adapter only where the task is solved
    assert routed["sa-generator-transfer"] == {(r, "sa" if r in solving else "__base__") for r, _ in routed["base"]}
    assert any(r in solving for r, _ in routed["base"]) and any(r not in solving for r, _ in routed["base"])
    assert {a for _, a in routed["base"]} == {"__base__"}     # adapters off
    assert {a for _, a in routed["trained"]} == ({"shared"} if policy == "sp" else set(train.ROLES[workflow]))


def voting_episodes():
    """One task, 3 samples. Generators (answer 4 is right): [4,4,4], [3,3,3], [5,4,6]; the aggregator picks
    2 (right), 1 (wrong), and writes 'solution 3' without a box (digit fallback, picks 6: wrong)."""
    gens = iter(["\\boxed{4}"] * 3 + ["\\boxed{3}"] * 3 + ["\\boxed{5}", "\\boxed{4}", "\\boxed{6}"])
    picks = iter(["\\boxed{2}", "\\boxed{1}", "solution 3 looks best"])
    engine = ScriptedEngine({"generator": lambda p: next(gens), "aggregator": lambda p: next(picks)})
    return play("voting", 3, engine, E.mode_route("trained", "ip"))


def test_per_role_regrading_and_evaluation_metrics():
    m = E.evaluation_metrics(voting_episodes())
    assert m["accuracy"] == pytest.approx(1 / 3)
    assert m["accuracy_std"] == pytest.approx(math.sqrt(2) / 3)  # per-sample accuracies 1, 0, 0
    assert m["pass@1"] == pytest.approx(1 / 3) and m["pass@2"] == pytest.approx(2 / 3)  # n = 3, c = 1
    assert "pass@4" not in m
    assert m["generator/acc"] == pytest.approx(4 / 9)        # each generator graded on its own answer
    assert m["aggregator/acc"] == pytest.approx(1 / 3)       # its selection was right once
    assert m["any_correct"] == pytest.approx(2 / 3)          # samples 0 and 2 had a right generator
    assert m["aggregator/format_ok"] == pytest.approx(2 / 3) and m["generator/format_ok"] == 1.0
    assert m["aggregator/fallback_digit"] == pytest.approx(1 / 3) and m["fallback_rate"] == pytest.approx(1 / 3)
    assert m["generator/response_len"] == 10                 # 9 bytes of \boxed{4} + EOS


def test_undefined_rates_are_null_in_results():
    engine = ScriptedEngine({"generator": lambda p: "\\boxed{4}", "evaluator": lambda p: "\\boxed{Correct}"})
    eps = play("evalopt", 2, engine, E.mode_route("trained", "ip"))
    m = E.evaluation_metrics(eps)
    assert m["fix_rate"] is None and m["p_retry_first_wrong"] is None  # no first attempt was wrong
    assert m["break_rate"] == 0.0 and m["retry_rate"] == 0.0 and m["evaluator/acc"] == 1.0
    json.loads(json.dumps(m, allow_nan=False))  # standard JSON


def test_trajectory_dump_layout_and_content(tmp_path):
    eps = voting_episodes()
    folder = runfolder.trajectory_folder(str(tmp_path), "math-d0", "trained", 3)
    paths = runfolder.dump_trajectories(eps, folder)
    assert folder == os.path.join(str(tmp_path), "trajectories", "math-d0", "trained-step_000003")
    assert sorted(os.listdir(folder)) == ["episode_t1_0.json", "episode_t1_1.json", "episode_t1_2.json"]
    assert len(paths) == 3
    with open(os.path.join(folder, "episode_t1_2.json")) as f:
        ep = json.load(f)
    assert ep["task"] == {"id": "t1", "question": "What is 2 + 2?", "answer": "4"}
    assert (ep["sample"], ep["final_answer"], ep["correct"]) == (2, "6", False)
    calls = ep["calls"]
    assert [(c["name"], c["role"], c["adapter"]) for c in calls] == [
        ("generator0", "generator", "generator"), ("generator1", "generator", "generator"),
        ("generator2", "generator", "generator"), ("aggregator", "aggregator", "aggregator")]
    assert [(c["output"], c["parsed"], c["correct"], c["reward"]) for c in calls[:3]] == [
        ("\\boxed{5}", "5", False, 0.0), ("\\boxed{4}", "4", True, 0.0), ("\\boxed{6}", "6", False, 0.0)]
    assert calls[3]["metrics"]["parse"] == "digit" and calls[3]["correct"] is False
    assert "Solution 3" in calls[3]["messages"][-1]["content"]
    # task ids with a slash (HumanEval/0) still make one flat file name
    runfolder.dump_trajectories(eps[:1], str(tmp_path / "x"))
    eps[0].task = Task("HumanEval/0", "q", "", "code")
    (path,) = runfolder.dump_trajectories(eps[:1], str(tmp_path / "x"))
    assert os.path.basename(path) == "episode_HumanEval-0_0.json"


# ---------------------------------------------------------------- real tiny runs

TINY = ["--model", "tiny", "--max-new-tokens", "6", "--tasks-per-step", "2", "--n", "2", "--n-val", "2"]


@pytest.fixture(scope="module")
def trained_runs(tmp_path_factory):
    """A single-agent run (1 step) and two Voting runs (IP, SP; 2 steps, validated and saved every step),
    trained once per module; tests get copies (`runs`), since evaluations append to a run's eval.jsonl."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, extra in (("sa", ["--workflow", "single", "--steps", "1", "--val-every", "0"]),
                        ("voting_ip", ["--workflow", "voting", "--policy", "ip", "--steps", "2", "--val-every", "1"]),
                        ("voting_sp", ["--workflow", "voting", "--policy", "sp", "--steps", "2", "--val-every", "1"])):
        out[name] = train.main(TINY + extra + ["--save-every", "1", "--run-dir", str(root / name)])
    return out


@pytest.fixture
def runs(trained_runs, tmp_path):
    """This test's own copies of the trained runs: whatever it writes, no other test sees."""
    return {name: shutil.copytree(run, tmp_path / "runs" / name).as_posix() for name, run in trained_runs.items()}


def test_one_step_and_every_checkpoint(runs):
    run = runs["voting_ip"]
    first = E.main(["--run", run, "--mode", "trained", "--step", "1"])
    assert [(r["step"], r["mode"], r["cell"], r["dataset"], r["n"]) for r in first] == \
        [(1, "trained", "Voting-IP-Tiny-Math", "math-d0", 1)]
    assert [r["step"] for r in E.main(["--run", run, "--mode", "trained", "--every-checkpoint"])] == [1, 2]
    assert [r["step"] for r in runfolder.read_results(os.path.join(run, "eval.jsonl"))] == [1, 1, 2]
    record = runfolder.read_results(os.path.join(run, "eval.jsonl"))[-1]
    expected = {"accuracy", "accuracy_std", "pass@1", "generator/acc", "aggregator/acc", "any_correct"}
    assert expected <= set(record["metrics"])


def test_base_mode_is_step_zero_without_adapters(runs):
    (record,) = E.main(["--run", runs["voting_sp"], "--mode", "base", "--n", "2", "--dump"])
    assert (record["step"], record["mode"], record["tasks"]) == (0, "base", 2)
    assert set(record["metrics"]) >= {"pass@1", "pass@2"}
    folder = os.path.join(runs["voting_sp"], "trajectories", "math-d0", "base-step_000000")
    assert record["trajectories"] == folder and len(os.listdir(folder)) == 2 * 2  # 2 tasks x 2 samples
    with open(os.path.join(folder, sorted(os.listdir(folder))[0])) as f:
        assert {c["adapter"] for c in json.load(f)["calls"]} == {"__base__"}


def test_sa_transfer_loads_the_sa_adapter_into_every_role(runs, tmp_path, capsys):
    from peft.utils import load_peft_weights
    sa_args, voting_args = runfolder.read_run_args(runs["sa"]), runfolder.read_run_args(runs["voting_ip"])
    torch.manual_seed(123)  # a fresh adapter init that differs from the saved one
    model, _, _ = E.build_model(voting_args, "sa-transfer", sa_args, "cpu")
    assert list(model.peft_config) == ["sa"]
    saved = load_peft_weights(os.path.join(runs["sa"], "checkpoints", "step_000001", "adapters", "shared"))
    live = {n: p for n, p in model.named_parameters() if "lora_A" in n}
    assert not all(torch.equal(live[k.replace(".weight", ".sa.weight")], v) for k, v in saved.items() if "lora_A" in k)
    E.load_step(model, "sa-transfer", runs["voting_ip"], runs["sa"], sa_args, 1)
    assert all(torch.equal(live[k.replace(".weight", ".sa.weight")], v) for k, v in saved.items() if "lora_A" in k)

    out = str(tmp_path / "results.jsonl")
    (record,) = E.main(["--run", runs["voting_ip"], "--mode", "sa-transfer", "--sa-run", runs["sa"], "--dump",
                        "--out", out])
    assert (record["mode"], record["step"], record["workflow"], record["sa_cell"]) == \
        ("sa-transfer", 1, "voting", "Single-SP-Tiny-Math")
    calls = []
    for name in os.listdir(record["trajectories"]):
        with open(os.path.join(record["trajectories"], name)) as f:
            calls += json.load(f)["calls"]
    assert {c["adapter"] for c in calls} == {"sa"} and {c["role"] for c in calls} == {"generator", "aggregator"}
    assert [r["step"] for r in E.main(["--run", runs["voting_ip"], "--mode", "sa-transfer", "--sa-run",
                                       runs["sa"] + "/", "--every-checkpoint", "--out", out])] == [1]  # its only one
    with pytest.raises(SystemExit) as e:
        E.main(["--run", runs["voting_ip"], "--mode", "sa-transfer", "--sa-run", runs["voting_sp"]])
    assert e.value.code == 2 and "trained workflow 'voting', not 'single'" in capsys.readouterr().err


def test_swapped_mode_puts_each_role_on_the_others_adapter_beside_trained(runs, capsys):
    """`--mode swapped` on an IP run: the trained checkpoint evaluated twice on the same tasks and seed, as trained
    and with the generator and the aggregator on each other's adapter; a line sets them side by side. Not an IP
    run, a role the workflow lacks, or --swap without the mode: one line each."""
    trained, swapped = E.main(["--run", runs["voting_ip"], "--mode", "swapped", "--n", "2", "--dump"])
    assert [(r["mode"], r["step"], r.get("swap")) for r in (trained, swapped)] == \
        [("trained", 2, None), ("swapped", 2, ["generator", "aggregator"])]
    for record, want in ((trained, {"generator": "generator", "aggregator": "aggregator"}),
                         (swapped, {"generator": "aggregator", "aggregator": "generator"})):
        for name in os.listdir(record["trajectories"]):
            with open(os.path.join(record["trajectories"], name)) as f:
                assert all(want[c["role"]] == c["adapter"] for c in json.load(f)["calls"])
    a, b = trained["metrics"], swapped["metrics"]
    line = (f"Voting-IP-Tiny-Math swapped generator <-> aggregator, step 2: accuracy {b['accuracy']:.3f} (trained "
            f"{a['accuracy']:.3f}); own format, swapped (trained): generator {b['generator/format_ok']:.2f} "
            f"({a['generator/format_ok']:.2f}), aggregator {b['aggregator/format_ok']:.2f} "
            f"({a['aggregator/format_ok']:.2f})")
    assert line in capsys.readouterr().out
    assert "| swapped (generator <-> aggregator) | 2 |" in E.main(["table", runs["voting_ip"]])
    for argv, says in (([runs["voting_sp"], "--mode", "swapped"], "needs a multi-agent IP run, not Voting-SP-Tiny"),
                       ([runs["voting_ip"], "--mode", "swapped", "--swap", "generator,worker"],
                        "--swap generator,worker: expected two of voting's role types"),
                       ([runs["voting_ip"], "--swap", "generator,aggregator"], "--swap is for --mode swapped")):
        with pytest.raises(SystemExit) as e:
            E.main(["--run", *argv])
        err = capsys.readouterr().err
        assert e.value.code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_swapped_defaults_to_the_workflows_last_two_role_types(runs, monkeypatch, capsys):
    """Without --swap, `--mode swapped` exchanges the last two role types of the run's workflow (workflows.ROLES),
    which gives the three paper workflows their pairs; a workflow a fork adds to WORKFLOWS and ROLES only (here
    `critique`, Voting's flow with its roles listed aggregator first) evaluates swapped with no other edit, and a
    workflow with one role type is one line, exit 2."""
    import workflows
    ip = {"policy": "ip", "model": "tiny", "task": "math"}
    assert {w: E.swap_pair({**ip, "workflow": w}, None) for w in ("voting", "evalopt", "orchworkers")} == \
        {"voting": ("generator", "aggregator"), "evalopt": ("generator", "evaluator"),
         "orchworkers": ("worker", "synthesizer")}
    monkeypatch.setitem(workflows.WORKFLOWS, "critique", workflows.voting)
    monkeypatch.setitem(workflows.ROLES, "critique", ["aggregator", "generator"])
    monkeypatch.setitem(workflows.ROLES, "solo", ["generator"])
    args_path = os.path.join(runs["voting_ip"], "args.json")
    with open(args_path) as f:
        saved = json.load(f)
    with open(args_path, "w") as f:
        json.dump({**saved, "workflow": "critique"}, f)
    trained, swapped = E.main(["--run", runs["voting_ip"], "--mode", "swapped"])
    assert (trained["workflow"], swapped["swap"]) == ("critique", ["aggregator", "generator"])
    with pytest.raises(SystemExit) as e:
        E.swap_pair({**ip, "workflow": "solo"}, None)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "needs a multi-agent IP run" in err and len(err.strip().splitlines()) == 1


def test_plot_draws_one_line_per_run_plus_base(runs, tmp_path):
    run_dirs = [runs["voting_ip"], runs["voting_sp"]]
    figures = E.main(["plot", *run_dirs, "--out", str(tmp_path / "plots")])
    for _, path in figures.values():
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    ax = figures["val_accuracy"][0].axes[0]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["Voting-IP-Tiny-Math", "Voting-SP-Tiny-Math", "base"]
    for line, run in zip(lines, run_dirs):
        metrics = runfolder.read_results(os.path.join(run, "metrics.jsonl"))
        val = [(m["step"], m["val/success"]) for m in metrics if "val/success" in m]
        assert list(line.get_xdata()) == [0, 1, 2] and list(line.get_ydata()) == [v for _, v in val]
    # no base record in its eval.jsonl: the step-0 validation
    step0 = runfolder.read_results(os.path.join(runs["voting_ip"], "metrics.jsonl"))[0]
    assert list(lines[2].get_ydata()) == [step0["val/success"]] * 2 and lines[2].get_linestyle() == "--"
    panels = figures["roles"][0].axes
    assert [p.get_title() for p in panels] == ["gradient norm", "entropy", "response length (tokens)",
                                               "loss share"]
    assert len(panels[0].get_lines()) == 2 * 2  # two runs x (generator, aggregator)


def test_results_table_rows_columns_and_missing_metrics(tmp_path):
    """`eval.py table`: one row per record, in order, with the set it was evaluated on; accuracy (with its std when
    n > 1); `-` where a metric does not apply (no aggregator in a single-agent cell); columns no record has are left
    out (pass@2 needs n >= 2)."""
    single = {"cell": "SA-SP-SmolLM2-Math", "dataset": "math-d0", "mode": "base", "step": 0, "n": 1, "tasks": 32,
              "metrics": {"accuracy": 0.5, "accuracy_std": 0.0, "generator/acc": 0.5, "fallback_rate": 0.0}}
    voting = {"cell": "Voting-IP-SmolLM2-Math", "dataset": "aime2025", "mode": "sa-transfer",
              "sa_cell": "SA-SP-SmolLM2-Math", "step": 10, "n": 2, "tasks": 32,
              "metrics": {"accuracy": 0.625, "accuracy_std": 0.03125, "any_correct": 0.75, "generator/acc": 0.59375,
                          "aggregator/acc": 0.625, "aggregator/format_ok": None, "fallback_rate": 0.125}}
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(single) + "\n" + json.dumps(voting) + "\n")
    table = E.main(["table", str(path)])  # what `python eval.py table FILE` prints
    assert table.splitlines() == [
        "| cell | dataset | mode | step | samples | accuracy | any_correct | generator/acc | aggregator/acc | "
        "fallback_rate |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| SA-SP-SmolLM2-Math | math-d0 | base | 0 | 1 x 32 | 0.500 | - | 0.500 | - | 0.000 |",  # n = 1: no std
        "| Voting-IP-SmolLM2-Math | aime2025 | sa-transfer (SA-SP-SmolLM2-Math) | 10 | 2 x 32 | 0.625 ± 0.031 | 0.750 "
        "| 0.594 | 0.625 | 0.125 |"]
    with pytest.raises(SystemExit):  # the message: tests/test_bad_input.py
        E.main(["table", str(tmp_path / "missing")])


@pytest.mark.parametrize("cell,lengths", [("Voting-IP-0.6B-Math", (25600, 8192)), ("EvalOpt-SP-4B-Code", (15360, 5120)),
                                          ("SA-SP-1.7B-Math", (15360, 8192)), (None, (4096, 64))])
def test_a_cells_run_is_evaluated_with_the_papers_evaluation_lengths(cell, lengths):
    """Longer responses in evaluation than in training (math 8,192, code 5,120), and the evaluation prompt limits;
    a run that is not a cell keeps its own training lengths."""
    on_cpu = ["--device", "cpu", "--engine", "hf"]  # asked for: a cell on this machine is not refused
    args = vars(train_flags(["--cell", cell, *on_cpu] if cell else ["--model", "tiny"]))
    assert E.eval_lengths(args) == lengths
