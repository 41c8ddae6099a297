#!/bin/bash
# The device check of issue 9 (a learner that keeps the GPU busy), for the GPU machine.
# Prepare here: `bash ../shared/device/prepare.sh` (wheels into .whl/) and `python3 -m pip
# download -q --no-deps -d .whl threadpoolctl==3.8.0` (a dependency since the numpy MLP
# update; shared/device/wheels.txt predates it), then send .whl/
# along and run on the GPU machine, from the project root:
#   set -o pipefail; bash bench/gpu_check.sh 2>&1 | tee $OUT/log
# Every result is one JSON line in $OUT/results.jsonl (at most 8 files come back).
# Synthetic ingest (MLP Humanoid and SmallCNN Pong, 14 streams), then
# `hetrl local` Humanoid-v5 14 workers CUDA with the defaults and with the old default
# (--fragments-per-batch 2) for the same ~60 s, then Pong 14 workers CUDA defaults, then
# Pong under worker and central inference (issue 16, 60 s each); about 9 minutes in all,
# under the device's 10-minute limit per command: run it alone.
set -u
export PYTHONUNBUFFERED=1 MUJOCO_GL=disable
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
# The repository root is the hetrl package: make it importable as `hetrl` without
# installing it, and keep the root itself on the path for `bench`.
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/hetrl
export PYTHONPATH=/tmp/site:/tmp/pkg:$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
python3 -c 'import torch, grpc, gymnasium, mujoco, hetrl.learner.learner; print(torch.__version__, grpc.__version__, gymnasium.__version__, mujoco.__version__, torch.cuda.is_available())' || exit 4
git log --oneline -1 2>/dev/null
R=$OUT/results.jsonl

# One `hetrl local` run for about $SECONDS_PER_RUN s of training (a SIGTERM from timeout
# stops it gracefully and it still writes summary.json), summarized as one JSON line.
run() {
  local name=$1; shift; local d=/tmp/runs/$name; mkdir -p /tmp/runs
  timeout -s TERM "${SECONDS_PER_RUN:-75}" python3 -m hetrl local --no-progress --seed 1 --out "$d" --total-steps 100000000 "$@" > "$d.log" 2>&1
  local rc=$?
  python3 - "$d" "$name" "$rc" >> "$R" <<'EOF' || echo "{\"run\": \"$name\", \"rc\": $rc, \"log_tail\": $(tail -c 1500 "$d.log" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}" >> "$R"
import json, sys
d, name, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = json.load(open(f"{d}/summary.json"))
records = [json.loads(x) for x in open(f"{d}/metrics.jsonl")]
def mean(key):
    values = [r[key] for r in records if key in r]
    return round(sum(values) / len(values), 3) if values else None
collect, wait = s["worker_collect_seconds"], s["worker_wait_seconds"]
out = {"run": name, "rc": rc, "steps_per_s": round(s["global_step"] / s["wall_seconds"], 1),
       "worker_busy": round(collect / max(collect + wait, 1e-9), 3),
       "gpu_percent_mean": mean("utilisation/gpu_percent"),
       "learner_busy_mean": mean("utilisation/learner_busy_fraction"),
       "policy_lag_mean": mean("charts/policy_lag"),
       "fragments_per_batch_mean": mean("charts/fragments_per_batch"), **s}
print(json.dumps(out))
EOF
  tail -n 1 "$R" | cut -c1-400
}

# ---- CHECKS ----
# The Pong record of issue 29 runs alone (`ONLY=pong_record bash bench/gpu_check.sh`; it
# needs ale-py and opencv-python-headless wheels in .whl/ besides the usual ones):
# ALE/Pong-v5 with the defaults (the atari preset: the Atari pipeline and the Nature
# CNN), 14 workers, CUDA, 9 minutes; its metrics.jsonl comes back for the return curve,
# to put beside the 2-core CPU record and CleanRL's ppo_atari Pong curve.
if [ "${ONLY:-}" = pong_record ]; then
  SECONDS_PER_RUN=540 run pong_record --env ALE/Pong-v5 --workers 14 --device cuda
  cp /tmp/runs/pong_record/metrics.jsonl "$OUT/pong_record_metrics.jsonl" 2>/dev/null
  exit 0
fi
# The learner group of issue 31 runs alone (`ONLY=learner_group bash bench/gpu_check.sh`):
# update-only samples/s per rank, 1 rank against 2 (NCCL for the gradients), MLP Humanoid
# and the CNN; with one GPU the 2-rank line says NCCL needs a GPU per rank and is skipped.
if [ "${ONLY:-}" = learner_group ]; then
  python3 -m bench.group_updates --device cuda --ranks 1 2 2>&1 | tail -n 12
  cp bench/results/group_updates.json "$OUT/group_updates.json" 2>/dev/null
  exit 0
fi
# 0. No host sync inside the update (torch raises on one under sync debug mode "error").
python3 - >> "$R" <<'EOF' 2>&1
import json, torch, gymnasium as gym, numpy as np
from hetrl.learner.optimizer import PolicyAdam
from hetrl.learner.ppo import Batch, ppo_update_async
from hetrl.learner.settings import TrainSettings
from hetrl.rollout.policy import Policy
from hetrl.rollout.settings import PolicySettings
d, t, n = torch.device("cuda"), 64, 16
obs = gym.spaces.Box(-np.inf, np.inf, (348,), np.float64)
policy = Policy(obs, gym.spaces.Box(-0.4, 0.4, (17,), np.float32), PolicySettings()).to(d)
opt = PolicyAdam(policy, 1e-3)
flags = {k: torch.zeros(t, n, dtype=torch.bool, device=d) for k in ("terminated", "truncated")}
b = Batch(observations=torch.randn(t + 1, n, 348, dtype=torch.float64, device=d),
          actions=torch.randn(t, n, 17, device=d), logprobs=torch.full((t, n), -0.7, device=d),
          rewards=torch.ones(t, n, device=d), valid=torch.ones(t, n, dtype=torch.bool, device=d),
          valid_count=t * n, **flags)
ppo_update_async(policy, opt, b, TrainSettings())
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("error")
try:
    ppo_update_async(policy, opt, b, TrainSettings())
    result = "no sync"
except RuntimeError as exc:
    result = f"synced: {exc}"[:500]
torch.cuda.set_sync_debug_mode("default")
print(json.dumps({"run": "update_sync_free", "result": result}))
EOF
tail -n 1 "$R"
# 1. The learner alone: ingest vs its update-only ceiling, 14 synthetic gRPC streams.
#    Targets: ingest >= 80% of the ceiling (both), GPU busy >= 70% (CNN).
timeout 300 python3 -m bench.learner_scale --device cuda --workers 14 --seconds 20 \
  --models "mlp / Humanoid-v5" "cnn / Pong 4x84x84 u8" 2>&1 | grep -v " INFO "
python3 -c "import json; r = json.load(open('bench/results/learner_scale.json'))['results']; [print(json.dumps({'run': 'learner_scale', **x})) for x in r['runs']]; [print(json.dumps({'run': 'gil_probe', **x})) for x in r['gil_probe']]" >> "$R"
# 2. Humanoid-v5, 14 workers, CUDA: defaults (fragments per batch auto) against the old
#    default (2) for the same time. Targets: 0 dropped, workers busy >= 90%, and a better
#    mean return after the same ~60 s of training.
run hum_w14_cuda_auto --env Humanoid-v5 --workers 14 --device cuda
run hum_w14_cuda_fpb2 --env Humanoid-v5 --workers 14 --device cuda --fragments-per-batch 2
# 3. Pong (SmallCNN), 14 workers, CUDA, defaults. Target: not learner-bound, workers
#    busy >= 90% (the workers' CPU policy then bounds it).
run pong_w14_cuda_auto --env bench.envs:make_pong --policy bench.nets:SmallCNN --workers 14 --device cuda
# 4. Issue 16: Pong (SmallCNN), 14 workers x 16 envs x 32 steps, CUDA, worker against
#    central inference for the same time. Target: central >= 1.5x the env steps/s, with
#    GPU busy reported for both (same return after the same steps needs longer runs).
SECONDS_PER_RUN=60 run pong_w14_cuda_worker16 --env bench.envs:make_pong --policy bench.nets:SmallCNN --workers 14 --device cuda --envs-per-worker 16 --fragment-length 32
SECONDS_PER_RUN=60 run pong_w14_cuda_central16 --env bench.envs:make_pong --policy bench.nets:SmallCNN --workers 14 --device cuda --envs-per-worker 16 --fragment-length 32 --inference central
cp bench/results/learner_scale.json "$OUT/" 2>/dev/null
echo "results: $R"
