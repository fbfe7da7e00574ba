"""tealite's benchmark suite (pytest-benchmark); see conftest.py and report.py."""
