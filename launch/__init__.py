"""Starting hetrl: the CLI, local multiprocess runs, and (later) cluster entry points.

`run_local` is the public Python API. This room imports everything else and nothing
imports it.
"""

from hetrl.launch.local import RunResult, run_local

__all__ = ["RunResult", "run_local"]
