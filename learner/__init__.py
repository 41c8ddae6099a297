"""Learner side of hetrl: connects to every rollout worker, fans their fragments into one
bounded queue, corrects for policy lag with V-trace, trains with PPO's clipped objective,
and pushes weights back after every update.

Imports `rollout` and `protos`; never `launch`.
"""
