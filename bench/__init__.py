"""hetrl's benchmark suite: `python -m bench` runs them all (see bench/__main__.py)."""
