"""Env side of hetrl: vectorized gymnasium envs, a CPU copy of the policy, and the
gRPC worker that streams trajectory fragments to a learner.

Imports only `protos`; never the learner or the launcher.
"""
