"""`python -m hetrl.launch` runs the hetrl CLI (the same as the `hetrl` console script)."""

from hetrl.launch.cli import main

raise SystemExit(main())
