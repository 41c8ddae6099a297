"""`python -m launch` runs the hetrl CLI (the same as the `hetrl` console script)."""

from launch.cli import main

raise SystemExit(main())
