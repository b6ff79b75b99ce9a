"""Fitting routers: `tokenrouter fit` trains one router network or head row of a program on
the program's own model pair (the small model's greedy trajectories on a prompt set, every
position labelled by the large model with teacher forcing), chooses its threshold on a
seeded held-out split, and writes the weights with metadata and a report.

Modules: `prompts` (the JSONL prompt sets), `collect` (both engines in lockstep: labelled
rows, and routed greedy generation), `train` (the papers' networks as trained, label
schemes, thresholds, AUC), `fitting` (the whole job, one function a step), `job` (what the
steps pass each other), `target` (the router or head to fit, and the .route lines for it),
`report` (the report's sections and figure), `generation` (routed generation on
--eval-prompts), `output` (the files, written atomically). docs/fit.md describes the
command and what each label scheme simplifies.
"""
