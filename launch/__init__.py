"""Starting hetrl: the CLI, local multiprocess runs, cluster hosts, emulated and submitted
SageMaker jobs, their reports and costs.

`run_local` is the public Python API. This room imports everything else and nothing
imports it.
"""

from hetrl.launch.local import RunResult, run_local

__all__ = ["RunResult", "run_local"]
