"""The toy world's oracle (toyworld/toy.py) and its calibration (toyworld/calibration.py, eval.py calibrate): every
habit does what docs/toy_world.md says, the prompt parser reads every candidate, and the calibration report names every
target with its measured value."""
import dataclasses
import math
import os
import random
from collections import Counter

import pytest

from toyworld import calibration, reading, toy
from toyworld.reading import format_of, judged
from toyworld.toy import KNOBS, Oracle, chatml, oracle_text


def aggregator_prompt(solutions: list[str]) -> str:
    import tasks
    import workflows
    task = tasks.Task("t", "What is 3 + 4?", "7", "math")
    return chatml(workflows.aggregator_messages(task, solutions, workflows.WorkflowOptions()))


def test_the_last_candidate_ends_where_the_instruction_begins():
    """Only solution 3 is right. The instruction after the block has an example `\\boxed{1}`; read as part of
    solution 3 (the old pattern's lookahead never matched before `<|im_end|>`), it made solution 3 say 1 and the
    careful aggregator pick solution 1."""
    prompt = aggregator_prompt(["3 + 4 = 6.\n\n\\boxed{6}", "3 + 4 = 9.\n\n\\boxed{9}", "3 + 4 = 7.\n\n\\boxed{7}"])
    assert reading.candidates(reading.last_user(prompt)) == [6, 9, 7]
    careful = dict(KNOBS, select=1.0)  # the careful habit every time (the same knob before and after the fix)
    picks = [oracle_text("aggregator", prompt, random.Random(i), careful) for i in range(20)]
    assert all(p.endswith("\\boxed{3}") for p in picks), picks[0]  # no two agree: 7 lies between 6 and 9


def test_the_careful_aggregator_takes_the_plurality_and_the_hurried_one_favours_position():
    prompt = aggregator_prompt(["3 + 4 = 8.\n\n\\boxed{8}", "3 + 4 = 7.\n\n\\boxed{7}", "3 + 4 = 7.\n\n\\boxed{7}"])
    rng = random.Random(0)
    assert oracle_text("aggregator", prompt, rng, KNOBS, {"select": True}) == \
        "Answers 8, 7, 7: solutions 2 and 3 agree on 7.\n\n\\boxed{2}"
    hurried = [oracle_text("aggregator", prompt, rng, KNOBS, {"select": False})[-2] for _ in range(2000)]
    assert 0.45 < hurried.count("1") / 2000 < 0.55  # solution 1 half the time: 4.5 standard errors either side


def oracle_calls(workflow: str, n: int = 2, seed: int = 0) -> list:
    import eval
    episodes = eval.play_every_problem(workflow, n, Oracle(seed), lambda m: list(chatml(m).encode()))
    return [(c, chatml(c.messages)) for e in episodes for c in e.calls]


@pytest.mark.parametrize("workflow", ["single", "voting", "evalopt", "orchworkers"])
def test_every_oracle_output_is_in_its_own_format_and_judged_as_its_habit(workflow):
    calls = oracle_calls(workflow)
    records = [judged(c.name, prompt, c.text) for c, prompt in calls]
    assert all(r["own"] and not r["foreign"] for r in records)
    assert not any(r["states_answer"] for r in records)  # the evaluator never gives the answer away
    for habit in {r["habit"] for r in records}:  # each habit careful about as often as its knob says
        rate = sum(r["careful"] for r in records if r["habit"] == habit) / sum(r["habit"] == habit for r in records)
        assert 0.3 <= rate <= 0.65, (habit, rate)


@pytest.mark.parametrize("workflow", ["voting", "evalopt", "orchworkers"])
def test_a_box_of_another_roles_kind_is_counted_and_the_oracles_own_are_not(workflow):
    """Finding 5 by the box (toyworld/toy_hooks.py `foreign_box`): every role of the oracle boxes its own kind, so
    validation's `<role>/foreign_box` is 0 for each; outputs written by hand that box another role's kind count
    (the first study's capture: an aggregator boxing an answer, an evaluator a number), their own kind does not."""
    import eval
    import workflows
    from toyworld.toy_hooks import foreign_box, role_tallies
    episodes = eval.play_every_problem(workflow, 1, Oracle(0), lambda m: list(chatml(m).encode()))
    tallies = role_tallies(episodes, lambda ids: bytes(ids).decode())
    boxes = {key: num / den for key, (num, den) in tallies.items() if key.endswith("/foreign_box")}
    assert boxes == {f"{role}/foreign_box": 0.0 for role in workflows.ROLES[workflow]}
    seen = reading.Seen(3, "+", 4, 7, [7, 8, 7], None, None, "")
    for role, text, foreign in [
            ("aggregator", "I trust solution 3.\n\n\\boxed{33}", True),   # an answer where a pick belongs
            ("aggregator", "\\boxed{2} or \\boxed{33}", False),            # the parser reads the first box
            ("aggregator", "Answers 7, 8, 7: solutions 1 and 3 agree on 7.\n\n\\boxed{1}", False),
            ("aggregator", "\\boxed{Correct}", True),
            ("evaluator", "Looks fine.\n\n\\boxed{Correct}", False),
            ("evaluator", "3 + 4 = 7.\n\n\\boxed{7}", True),              # a number where a verdict belongs
            ("generator", "3 + 4 = 7.\n\n\\boxed{7}", False),
            ("generator", "Check: 7 - 4 = 3.\n\n\\boxed{Incorrect}", True),  # a verdict where an answer belongs
            ("synthesizer", "Going with worker 2.\n\n\\boxed{8}", False),
            ("worker", "For +: 3 + 4 =", False),                            # no box: the format counts that
            ("orchestrator", "STRATEGY 1: Make a ten first.", False),
            ("orchestrator", "STRATEGY 1: Make a ten first.\n\\boxed{7}", True)]:
        assert foreign_box(role, seen, text) == foreign, (role, text)


def test_a_solvers_correctness_cannot_be_read_off_its_length():
    calls = [(c, p) for c, p in oracle_calls("voting") if c.role == "generator"]
    records = [dict(judged(c.name, p, c.text), length=len(c.text)) for c, p in calls]
    assert calibration.length_predictability(records) <= calibration.LENGTH_AT_MOST
    assert 0.4 < sum(r["right"] for r in records) / len(records) < 0.65  # 0.4 careful + 0.6 x 0.2 lucky = 0.52


def test_each_role_format_is_told_apart():
    assert format_of("3 + 4 = 7.\n\n\\boxed{7}") == ("solver", True)
    assert format_of("I trust solution 2.\n\n\\boxed{2}") == ("aggregator", False)
    assert format_of("Check: 7 - 4 = 3; the problem has 3.\n\n\\boxed{Correct}") == ("evaluator", True)
    assert format_of("Going with worker 1.\n\n\\boxed{7}") == ("synthesizer", False)
    assert format_of("Workers say 7, none, 8: the middle answer is 7.\n\n\\boxed{7}") == ("synthesizer", True)
    assert format_of("Answers 6, 9, 7: solution 3 is in the middle.\n\n\\boxed{3}") == ("aggregator", True)
    assert format_of("STRATEGY 1: Make a ten first.\nSTRATEGY 2: Use a number line.") == ("orchestrator", True)
    assert format_of("The answer is 7.") == (None, False)


def test_a_worker_names_its_strategys_operation_and_is_careful_when_it_suits():
    """v7: a worker's line starts with the operation its strategy is made for, so whether the strategy suits the
    problem is two symbols of the worker's own line; suited, it is careful 0.85 of the time, unsuited never."""
    import tasks
    import workflows
    task, opts = tasks.Task("t", "What is 3 + 4?", "7", "math"), workflows.WorkflowOptions()
    lines = {}
    for strategy in ("Make a ten first.", "Use repeated addition."):
        prompt = chatml(workflows.solver_messages(task, opts, strategy))
        lines[strategy] = [oracle_text("worker0", prompt, random.Random(i), KNOBS) for i in range(400)]
    suited, unsuited = lines["Make a ten first."], lines["Use repeated addition."]
    assert all(x.startswith("For +: 3 + 4 = ") for x in suited)
    assert all(x.startswith("For ×: 3 + 4 = ") for x in unsuited)
    assert format_of(suited[0]) == ("solver", True)
    right = [sum(x.endswith("\\boxed{7}") for x in xs) / 400 for xs in (suited, unsuited)]
    # 0.85 + 0.15 x 0.2 lucky = 0.88 against 0.2: 400 draws put each within 0.07 (3.5 standard errors)
    assert abs(right[0] - 0.88) < 0.07 and abs(right[1] - 0.2) < 0.07, right


def test_the_hurried_orchestrator_misreads_the_operation():
    """Careful: the operation's three strategies in order; hurried: another operation's three, each other
    operation about half the time, so that a hurried plan leaves every worker unsuited."""
    s = reading.Seen(3, "+", 4, 7, [], None, None, "")
    assert toy.plan(s, True, random.Random(0)).splitlines()[0] == "STRATEGY 1: Count on from the larger number."
    drawn = random.Random(0)
    toy.plan(s, True, drawn)
    assert drawn.random() == random.Random(0).random()  # a careful plan draws no misreading (v8)
    firsts = [toy.plan(s, False, random.Random(i)).splitlines()[0] for i in range(400)]
    assert set(firsts) == {"STRATEGY 1: Count back from the first number.", "STRATEGY 1: Use repeated addition."}
    assert 0.4 < firsts.count("STRATEGY 1: Use repeated addition.") / 400 < 0.6  # 0.5: 4 standard errors


def test_arithmetic_facts_are_practised_in_the_models_own_line():
    """The facts come as drills whose prompt does not show the operands: `23 ÷ 4 = ` written, `5 r 3.` learned;
    each division check twice, each of the 243 problems' own facts PROBLEM_FACT_COPIES times, the rest once."""
    from toyworld import toy_model
    known = toy_model.in_line(toy_model.facts())
    drill = [{"role": "user", "content": "Work it out."}]
    assert (drill, "23 ÷ 4 = ", "5 r 3.") in known
    assert all("Work it out." == m[0]["content"] and w.endswith(" = ") for m, w, _ in known)
    division = [k for k in known if "÷" in k[1]]
    assert len(division) == 2 * len({w for _, w, _ in division})  # each division check twice
    assert known.count((drill, "7 × 6 = ", "42.")) == toy_model.PROBLEM_FACT_COPIES == 4
    assert known.count((drill, "9 - 9 = ", "0.")) == 4  # a problem whose answer is 0
    assert known.count((drill, "12 - 3 = ", "9.")) == 1  # an evaluator's check, not a problem
    assert sum(n == 4 for n in Counter(w for _, w, _ in known).values()) == 243  # 9 x 9 x 3 problems


def test_a_careful_evaluator_checks_by_the_inverse_and_points_the_retry():
    import tasks
    import workflows
    task, opts = tasks.Task("t", "What is 6 × 3?", "18", "math"), workflows.WorkflowOptions()
    history = workflows.solver_messages(task, opts) + [{"role": "assistant", "content": "6 × 3 = 20.\n\n\\boxed{20}"}]
    prompt = chatml(workflows.evaluator_messages(task, "", history, opts))
    said = oracle_text("evaluator", prompt, random.Random(0), KNOBS, {"judge": True})
    assert said == "Check: 20 ÷ 3 = 6 r 2; the problem has 6: too high.\n\n\\boxed{Incorrect}"
    retry = chatml(workflows.refine_messages(task, opts, "", "", history + [{"role": "assistant", "content": said}]))
    moved = {oracle_text("generator", retry, random.Random(i), KNOBS, {"retry": False}) for i in range(20)}
    assert moved == {"6 × 3 = 19.\n\n\\boxed{19}", "6 × 3 = 18.\n\n\\boxed{18}"}  # down by 1 or 2, as told


def test_a_role_the_toy_world_does_not_know_is_one_line_before_anything_is_written(monkeypatch, tmp_path, capsys):
    """A fork's workflow whose second call is a new role, `critic`, added to WORKFLOWS and ROLES only. `--model toy`
    cannot read a critic's outputs (validation reads each role's format: reading.OWN_FORMAT), so train.py refuses it
    in one line that names the role, the roles the toy world knows and what to do, exit 2, before anything is
    written. (Before, the run loaded the toy model, wrote its folder and stopped at its first validation on
    KeyError: 'critic'.) Another model runs the workflow as it is."""
    from test_flags import TINY

    import train
    import workflows

    def critique(ep, opts):
        gen = workflows.Call("generator", 0, workflows.solver_messages(ep.task, opts), is_answer=True)
        yield [gen]
        ask = f"{workflows.problem_text(ep.task)}\n\nCritique this solution:\n{gen.text}"
        yield [workflows.Call("critic", 0, [workflows.user(ask)])]
        ep.final_answer, ep.reward = gen.metrics["parsed"], gen.grade
    monkeypatch.setitem(workflows.WORKFLOWS, "critique", critique)
    monkeypatch.setitem(workflows.ROLES, "critique", ["generator", "critic"])
    parser = train.build_parser

    def with_critique():  # --workflow's choices, which a fork's WORKFLOWS holds from the start
        p = parser()
        action = next(a for a in p._actions if a.dest == "workflow")
        action.choices = [*action.choices, "critique"]
        return p
    monkeypatch.setattr(train, "build_parser", with_critique)
    run_dir = tmp_path / "toy-run"
    with pytest.raises(SystemExit) as e:
        train.main(["--model", "toy", "--workflow", "critique", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and not run_dir.exists()
    assert err.startswith("error: --model toy: --workflow critique has the role critic, which the toy world does "
                          "not know (it knows generator, worker, aggregator, evaluator, orchestrator, synthesizer);")
    assert "another --model" in err and "toyworld/reading.py" in err
    tiny_run = train.main([*TINY, "--workflow", "critique", "--steps", "1", "--run-dir", str(tmp_path / "tiny")])
    assert os.path.exists(os.path.join(tiny_run, "checkpoints"))


TOY_TEST_STEPS = 150  # habit steps of the small toy model (the full warm-up has 4,000): formats 0.91-1.0


@pytest.fixture(scope="module")
def small_toy(tmp_path_factory):
    """(cache folder, model folder): toy seed 0 warmed up with a small budget (a quarter of the oracle's episodes,
    rows enough for TOY_TEST_STEPS steps) on the suite's one thread, about a minute and a half. The format test
    samples it; the calibration report reads it from the cache, as `eval.py calibrate` finds a built seed."""
    import eval
    from toyworld import toy_model
    cache = str(tmp_path_factory.mktemp("cache"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(toy, "CACHE_DIR", cache)
        patch.setattr(toy_model, "EPISODES", {w: n // 4 for w, n in toy_model.EPISODES.items()})
        return cache, toy_model.build(0, eval.play_every_problem, steps=TOY_TEST_STEPS)


def test_the_toy_warm_up_teaches_every_roles_format(small_toy):
    """After a small warm-up budget, every role's output takes its parser's first path (a box, `STRATEGY i:`
    lines) at least 80% of the time, in every workflow the toy world plays (toy_model.EPISODES, the warm-up's; a
    fork's new workflow is not one of them): format is learned first, skill is what RL then has."""
    import torch

    import workflows
    from infra.tallies import rates
    from policies import BASE, HFEngine, chat_encoder, chat_prompt_ids, load_model
    from tasks import math_splits
    torch.manual_seed(0)
    model, tok = load_model(small_toy[1])
    engine = HFEngine(model, tok, 24, 0.7, 1.0, 256)
    options = workflows.WorkflowOptions(prompts="small", evalopt_context="reference", n_votes=3, max_iterations=3,
                                        max_subtasks=3)
    val = math_splits(170, 32, 0, 0)[1]
    # the warm-up renders prompts itself (no tokenizer yet): the same ids as at RL time
    messages = workflows.solver_messages(val[0], workflows.WorkflowOptions())
    assert chat_prompt_ids(tok, messages) == tok(toy.chatml(messages), add_special_tokens=False).input_ids
    from toyworld import toy_model
    for workflow in toy_model.EPISODES:
        roles = workflows.ROLES[workflow]
        assert set(roles) <= set(reading.OWN_FORMAT), workflow  # the toy world reads each one's format
        eps = workflows.rollout(val, 1, dataclasses.replace(options, workflow=workflow), engine,
                                chat_encoder(tok), lambda name: BASE)
        m = rates(workflows.episode_tallies(eps))
        for role in roles:
            assert m[f"{role}/format_ok"] >= 0.8, (workflow, role, m[f"{role}/format_ok"])


@pytest.fixture(scope="module")
def small_calibration(small_toy, tmp_path_factory):
    """The calibration of the small toy model on 12 problems, one episode each: a report that misses targets (so
    the exit code and the names of missed targets are exercised), in seconds."""
    import eval
    import tasks
    import workflows
    few = tasks.synthetic_math(243, difficulty=0, seed=0)[:12]

    def play(workflow, n, engine, encode, route=lambda name: name):
        return workflows.rollout(few, n, workflows.WorkflowOptions(workflow), engine, encode, route)
    out = tmp_path_factory.mktemp("out") / "calibration.jsonl"
    with pytest.MonkeyPatch.context() as patch, pytest.raises(SystemExit) as stopped:
        patch.setattr(toy, "CACHE_DIR", small_toy[0])  # built: calibrate finds the model there
        patch.setattr(eval, "play_every_problem", play)
        eval.main(["calibrate", "--seed", "0", "--episodes", "1", "--out", str(out)])
    return stopped.value.code, out


def test_the_calibration_report_names_every_target_and_exits_1_when_one_is_missed(small_calibration, capsys):
    import json
    code, out = small_calibration
    record = json.loads(out.read_text().splitlines()[-1])
    assert code == 1 and record["missed"]
    assert set(record["habits"]) == set(calibration.KINDS)
    assert set(record["swaps"]) == {f"{w} {name}" for w, _, name in calibration.SWAPS}
    assert "evaluator_edge" in record["structure"] and "retry_fixes" in record["structure"]
    assert all(0 <= record["oracle_success"][w] <= 1 for w in calibration.EPISODES)
    assert "solve: calls" in record["missed"]  # 12 problems x 1 episode: fewer than 500 calls


def test_every_evaluator_drill_is_the_careful_evaluators_own_line():
    """The drills (toyworld/toy_model.py) practise the evaluator's check inside its own output: each must be, word
    for word, what the careful evaluator writes for that attempt, or the warm-up would teach two habits."""
    from toyworld import toy_model
    drills = toy_model.drills(seed=0, per_reader=10)
    checks = [d for d in drills if d[1].startswith("Check: ")]
    assert len(checks) == 243 * 7  # every problem, every attempt off by up to 3 either way
    for messages, written, rest in checks:
        s = reading.read_prompt(chatml(messages))
        w = int(written.split()[1])
        attempt = reading.Seen(s.a, s.op, s.b, s.answer, [], None, w, "")
        assert written + rest == toy.judge(attempt, True, random.Random(0)), (written, rest)
    readers = [written + rest for _, written, rest in drills if not written.startswith("Check: ")]
    assert len(readers) == 20 and all(format_of(text)[1] for text in readers)  # careful, in their own format


def test_a_drill_row_puts_the_loss_on_what_follows_the_written_part():
    from toyworld import toy_model
    texts = [chatml([{"role": "user", "content": "What is 7 × 6?"}]) + "Check: 44 ÷ 6 = 7 r 2; ok."]
    tok = toy_model.train_tokenizer(texts * 4)
    prompt, completion = toy_model.drill_row(tok, [{"role": "user", "content": "What is 7 × 6?"}],
                                             "Check: 44 ÷ 6 = ", "7 r 2; ok.")
    assert tok.decode(prompt).endswith("Check: 44 ÷ 6 = ") or tok.decode(prompt).endswith("Check: 44 ÷ 6 =")
    assert tok.decode(completion).lstrip().startswith("7 r 2; ok.") and completion[-1] == tok.eos_token_id


def test_every_warm_up_token_weighs_the_same_whatever_its_batch():
    """The warm-up's loss sums token losses over a constant: a row's gradient is the same alone or batched with a
    long row. (With the batch's mean, the short row's gradient shrank 11x beside a 10-token row, and the model
    chose the short hurried outputs more often than its rows did.)"""
    import torch
    import transformers

    from toyworld import toy_model
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32))
    short, long = ([1, 2], [3]), ([4, 5], [6, 7, 8, 9, 10, 11, 12, 13, 14, 15])

    def grad(batch):
        model.zero_grad()
        loss, per_token = toy_model.batch_loss(model, batch)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()]), loss, per_token
    alone, both, only_long = grad([short]), grad([short, long]), grad([long])
    assert torch.allclose(both[0] - only_long[0], alone[0], atol=1e-6)  # float32 sums of a few dozen terms
    assert abs(float(both[1].detach()) * toy_model.TOKEN_NORM / 11 - both[2]) < 1e-5  # per token: the 11 tokens' mean


def test_a_warm_up_in_a_log_says_its_progress_every_tenth_of_its_steps(capsys):
    """Where the output is not a terminal (pytest captures it, as the study's build logs do), tqdm's bar is off, so
    warm_up prints a line every tenth of its steps: 20 steps, a line every 2, the last at step 20 with 0 left."""
    import torch
    import transformers

    from toyworld import toy_model
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32))
    losses = toy_model.warm_up(model, [([1, 2], [3, 4])] * 40, seed=0, steps=20, desc="[toy] test warm-up")
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[toy] test warm-up: ")]
    assert len(losses) == 20 and len(lines) == 10
    assert lines[0].startswith("[toy] test warm-up: step 2 of 20, loss ")
    assert lines[-1].startswith("[toy] test warm-up: step 20 of 20, loss ") and lines[-1].endswith("about 0.0 left")


def test_a_toy_run_says_in_one_line_when_its_seeds_model_is_not_calibrated(tmp_path, monkeypatch, capsys):
    """calibration.calibration_warning: the record `eval.py calibrate` keeps beside the model, else the committed
    study's (or its replication's) record of that seed at this VERSION (another version's is not this model's); one
    line when the record misses a target or there is none, nothing when it passes. build_before_load prints it
    after the build."""
    import json

    from toyworld import calibration, toy, toy_hooks, toy_model
    monkeypatch.setattr(toy, "CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(calibration, "STUDY_RESULTS", str(tmp_path / "study.json"))
    warning = calibration.calibration_warning
    assert warning(3) == ("note: no calibration record for the toy model of seed 3 here "
                          "(python -m toyworld.toy --calibrate --seed 3, about 3 minutes)")
    study = {"toy_version": toy.VERSION, "calibration": [{"seed": 3, "missed": ["retry: right - oracle"]}]}
    (tmp_path / "study.json").write_text(json.dumps(study))
    assert warning(3) == ("warning: the toy model of seed 3 misses 1 calibration target(s) (retry: right - oracle); "
                          "the study sets such a seed aside (docs/toy_world.md)")
    replicated = {**study, "replication": {"calibration": [{"seed": 7, "missed": []}]}}
    (tmp_path / "study.json").write_text(json.dumps(replicated))  # a replication seed's record counts too
    assert warning(7) is None and warning(3).startswith("warning:")
    (tmp_path / "study.json").write_text(json.dumps({**study, "toy_version": toy.VERSION - 1}))
    assert warning(3).startswith("note: no calibration record")
    os.makedirs(toy.folder(3))
    calibration.keep_beside_model(3, {"seed": 3, "missed": []})  # what `eval.py calibrate --seed 3` writes
    assert warning(3) is None
    monkeypatch.setattr(toy_model, "build", lambda seed, play: None)
    toy_hooks.build_before_load("toy", 3, play=None)
    assert capsys.readouterr().out == "toy model of seed 3: calibrated\n"


def test_a_study_seed_copies_its_committed_model_and_any_other_build_builds(tmp_path, monkeypatch, capsys):
    """toy_model.build: a study seed at the study's knobs and steps, into the cache, is its committed model copied
    file for file (the instrument the study calibrated, on any CPU, in seconds), with one line saying so; another
    seed, other steps or knobs, or a folder of the caller's (`--build-into`) build afresh: they reach the oracle's
    rollout, which this test's `play` stops at."""
    import json
    import shutil
    import tarfile

    from toyworld import toy_model
    built = tmp_path / "built"  # what a build writes, committed as a folder of one tar
    built.mkdir()
    (built / "model.safetensors").write_bytes(b"weights")
    (built / "toy.json").write_text(json.dumps({"minutes": 33.5, "versions": {"cpu_capability": "AVX512"}}))
    (tmp_path / "models").mkdir()
    with tarfile.open(tmp_path / "models" / f"toy-v{toy.VERSION}.tar", "w") as tar:
        for name in ("model.safetensors", "toy.json"):
            tar.add(built / name, arcname=f"seed2/{name}")
    monkeypatch.setattr(toy_model, "COMMITTED", str(tmp_path / "models"))
    monkeypatch.setattr(toy, "CACHE_DIR", str(tmp_path / "cache"))

    class Built(Exception):
        pass

    def play(*args, **kwargs):
        raise Built

    assert toy_model.build(2, play) == toy.folder(2)
    assert sorted(os.listdir(toy.folder(2))) == ["model.safetensors", "toy.json"]
    assert open(os.path.join(toy.folder(2), "model.safetensors"), "rb").read() == b"weights"
    assert "the study's toy model, copied from" in capsys.readouterr().out
    shutil.rmtree(toy.folder(2))
    for call in (lambda: toy_model.build(3, play), lambda: toy_model.build(2, play, steps=8),
                 lambda: toy_model.build(2, play, knobs=dict(KNOBS)),
                 lambda: toy_model.build(2, play, out=str(tmp_path / "afresh"))):
        with pytest.raises(Built):
            call()
    assert not os.path.exists(toy.folder(2))


def test_the_committed_models_are_the_study_candidates_as_recorded(tmp_path):
    """docs/findings/models/ holds seeds 0-5 at this VERSION, one tar of the folders a build writes, each
    toy.json the build record of avx512/ in docs/findings/builds.jsonl (its last warm-up loss to every digit: the
    model the calibration table describes), each loading as the toy model's shape (770,944 parameters, its
    1,024-token vocabulary)."""
    import json

    from safetensors import safe_open

    from toyworld import toy_model
    from toyworld.results import file_records
    seeds = [s for s in range(20) if toy_model.committed(s)]
    assert seeds == [0, 1, 2, 3, 4, 5]
    builds = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "findings",
                          "builds.jsonl")
    for seed in seeds:
        toy_model.copy_committed(seed, str(tmp_path / str(seed)))
        record = json.load(open(tmp_path / str(seed) / "toy.json"))
        assert [record] == file_records(builds, f"avx512/seed{seed}.toy.json"), seed
        with safe_open(str(tmp_path / str(seed) / "model.safetensors"), "pt") as f:
            shapes = {name: f.get_slice(name).get_shape() for name in f.keys()}
        assert sum(math.prod(s) for s in shapes.values()) == 770_944, seed
        assert shapes["model.embed_tokens.weight"] == [toy_model.VOCAB, toy_model.SHAPE["hidden_size"]]


def test_a_build_into_a_folder_that_holds_files_is_one_line(tmp_path, capsys):
    """`eval.py calibrate --build-into DIR`: a build writes a new folder (it renames its own over DIR), so a
    folder with files in it is refused in one line before anything is built or removed."""
    import eval
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(SystemExit) as stop:
        eval.main(["calibrate", "--seed", "0", "--build-into", str(tmp_path)])
    assert stop.value.code == 2 and (tmp_path / "mine.txt").read_text() == "keep me"
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"--build-into {tmp_path}: not empty; a build writes a new folder") and "\n" not in err
