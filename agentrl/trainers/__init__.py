"""Trainers: the local PPO engine and the bookkeeping of a run (checkpoints, tracking, plots)."""
