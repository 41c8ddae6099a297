"""`python -m hetrl` runs the hetrl CLI (the same as the `hetrl` console script)."""

from hetrl.launch.cli import main

if __name__ == "__main__":  # importing it (docs tools do) runs nothing
    raise SystemExit(main())
