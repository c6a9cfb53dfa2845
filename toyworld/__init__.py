"""The toy world and its study: a small model whose every role has a careful and a hurried habit,
an oracle that knows which is which, and the study that trains the paper's workflows on it
(docs/toy_world.md, docs/findings.md). It is built on the method (the six concept files, run as
commands) and on infra/; neither imports it but through its one hook, toy_hooks.py.

    toy_hooks.py    the one hook: the toy model built and found, the regime `--model toy`
                    presets, each role's validation tallies, `eval.py calibrate`
    toy.py          the oracle: each role's careful and hurried habit
    reading.py      how a prompt and an output are read: what a role sees, its format, right or not
    toy_model.py    the toy model: the oracle's transcripts, a tokenizer, a small Llama warmed up
    calibration.py  the toy model at base against targets fixed before any RL run
    study.py        the study: the sweep, the findings' grid over seeds, evaluation, verdicts
    declared.py     what the study fixed before its runs: the grid, the sweep's rule, FINDINGS
    jobs.py         the study's commands side by side, forked from a server that imported torch;
                    its runs' names and the commits that ran them
    fold.py         the study's results from its run folders, nothing run: the compact results,
                    study.json, figures, pages
    findings.py     the study's numbers from its results, judged by infra/paired.py's rules: a
                    seed's value the mean of its runs
    tables.py       the findings page's tables, written from the judged comparisons
    verdicts.py     the verdict table a reader sees first (the predeclared comparisons), and the
                    dated table of what was decided after the data
    power.py        what the seeds and runs can tell, comparison by comparison
                    (infra/detection.py's simulations)
    reproduce.py    a committed run trained again and compared with its record
    ablate.py       a fork's ablation judged as the study judges: two arms of runs paired by
                    seed, the interval, what the size detects, a verdict at a stated threshold
    ablation_size.py  an ablation's size and its committed baseline (reused where reproduced)
    ablation_page.py  docs/ablations.md's numbers, from what is committed
    figures.py      the findings' figures, from the study's results
    results.py      the compact results, a JSON Lines file per study and replication,
                    and their one loader

    python -m toyworld.toy --build --seed 6      # another seed's toy model
    python -m toyworld.study --help              # the study
"""
