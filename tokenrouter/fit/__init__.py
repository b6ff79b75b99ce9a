"""Fitting routers: `tokenrouter fit` trains one router network or head row of a program on
the program's own model pair (the small model's greedy trajectories on a prompt set, every
position labelled by the large model with teacher forcing), chooses its threshold on a
seeded held-out split, and writes the weights with metadata and a report.

Modules: `prompts` (the JSONL prompt sets), `collect` (both engines in lockstep: labelled
rows, and routed greedy generation), `train` (the papers' networks as trained, label
schemes, thresholds, AUC), `report` (the figure), `fitting` (the whole job). docs/fit.md
describes the command and what each label scheme simplifies.
"""
