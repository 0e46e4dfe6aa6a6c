import sys
from pathlib import Path

# tests/ holds the harness modules (pipeline.py, conftest_pipeline.py); they are plain modules,
# not a package, so put their directory on the path before importing the plugin.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conftest_pipeline import *  # noqa: E402,F401,F403  (fixture + hooks)
