"""Integrations with the libraries RL and evaluation teams run: one module per library, each an
optional extra (``pip install 'gymtrace[gymnasium]'``), each importing only the public gymtrace API
and its own library. Importing this package imports none of them."""
