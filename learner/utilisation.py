"""Sample how busy the learner host is: CPU, memory, and the GPU when there is one.

Called once per update from the training loop; every call is cheap (psutil reads /proc,
NVML answers from the driver). GPU utilisation needs NVML (the nvidia-ml-py package,
which torch.cuda.utilization uses); without it only GPU memory is reported. Busy
fractions of the learner and workers are computed by the learner from its own timers,
not here. Never raises: a sensor that fails is simply left out.
"""

from __future__ import annotations

import psutil
import torch


class UtilisationSampler:
    """CPU and memory of this host and process; GPU utilisation and memory if on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.process = psutil.Process()
        psutil.cpu_percent(interval=None)  # the first reading only starts the window
        self.process.cpu_percent(interval=None)

    def sample(self) -> dict[str, float]:
        out = {
            "utilisation/host_cpu_percent": psutil.cpu_percent(interval=None),
            "utilisation/host_memory_percent": psutil.virtual_memory().percent,
            "utilisation/learner_cpu_percent": self.process.cpu_percent(interval=None),
            "utilisation/learner_rss_mb": self.process.memory_info().rss / 2**20,
        }
        if self.device.type == "cuda":
            out["utilisation/gpu_memory_mb"] = torch.cuda.memory_reserved(self.device) / 2**20
            try:
                out["utilisation/gpu_percent"] = float(torch.cuda.utilization(self.device))
            except Exception:  # NVML missing or unsupported: memory is still reported
                pass
        return out
