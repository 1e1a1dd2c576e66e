"""Small measurement scripts, run from the repository root (`PYTHONPATH=. python scripts/...`).

A package only so that the import contracts (pyproject.toml) can check that no script imports
the tests: scripts build their own inputs.
"""
