# The harness modules (pipeline.py, conftest_pipeline.py) are in tests/support, which pytest's
# `pythonpath` setting (pyproject.toml) puts on the path.
from conftest_pipeline import *  # noqa: F403  (fixture + hooks)
