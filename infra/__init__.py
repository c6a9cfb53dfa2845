"""The machinery that runs the method: nothing here is needed to learn it, and nothing here imports
the six concept files at the top level (they import from here).

    flags.py        the command line: flags made from settings' fields, the checks, resume, a
                    run's first lines
    environment.py  the machine a run needs (device, packages, model files, versions), checked
                    before anything loads; `--engine auto` resolved
    roles.py        a call's role type: generator0 -> generator
    runfolder.py    one-line errors, args.json, the JSONL files, dumps, stop signals, write errors
    checkpoints.py  seeding and random state, adapters as PEFT folders, atomic checkpoints, resume
    distributed.py  torchrun: the process group, each rank's share, gathering values, summing
                    gradients; the one device a process claims
    tallies.py      metrics as numerator and denominator, added over batches and ranks, divided once
    update_report.py  what the GRPO update reports: per-role statistics, each role's own gradient
                    (SP, finding 3)
    models.py       the built-in models (tiny, tiny-qwen3, random-qwen3-0.6b), the packaged
                    SmolLM2, rLLM's Qwen chat, the library-version shims and the versions the tests
                    run
    vllm_engine.py  the vLLM sampling engine: its log-prob drift check per adapter, its sleep and
                    wake (its hooks)
    memory.py       the one-GPU memory plan's terms, the HF engine's generate() budget, a step's
                    measured peaks behind an engine's hooks around an update (StepHooks)
    data.py         DAPO, DeepCoder and HumanEval rows, and the reference's train / held-out splits
    cells.py        the paper's 48 cells and the flags each sets
    commands.py     eval.py's commands besides evaluating: plot, table, report, calibrate
    results.py      `eval.py table`: evaluation records as one markdown table
    plots.py        validation and per-role curves of runs (`eval.py plot`)
    samples.py      the validation episodes train.py keeps, and their reading back
    report.py       `eval.py report`: a run's curves, warnings and episodes as one HTML page
    report_warnings.py  the report's warnings, from the metrics alone (length, format, jumps, drop)
    sandbox.py      runs an untrusted program against tests (the code reward)

The toy world and its study live apart, in toyworld/, which imports from here; nothing here imports
it but its one hook, toyworld/toy_hooks.py (infra/flags.py: the regime `--model toy` presets;
commands.py: calibrate).
"""
