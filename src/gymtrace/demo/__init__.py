"""The demos behind ``gymtrace demo``: functions that run them and return what happened (spans,
summaries, where the spans went); the command line (``gymtrace._cli``) prints.

- ``local``: a simulated gym run in this process, every case of the vocabulary (``gymtrace demo``);
- ``distributed``: driver, agent, model and environment as separate processes, one trace per
  rollout across all of them (``gymtrace demo --distributed``);
- ``services``: the agent, model and environment servers the distributed demo starts.

Importing this package imports none of them.
"""
