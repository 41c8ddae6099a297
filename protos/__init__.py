"""Wire schema of hetrl and the code generated from it.

Only the schema (`hetrl.proto`) and protoc's output live here; encoding of arrays
and everything with behaviour belongs in `rollout`. Nothing here imports the rest
of hetrl.
"""
