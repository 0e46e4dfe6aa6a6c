"""Integrations with the libraries RL and evaluation teams run: one module per library, each an
optional extra (``pip install 'gymtrace[httpx]'``), each importing only the public gymtrace API
and its own library. Importing this package imports none of them.

- ``gymtrace.integrations.httpx``: ``HttpxTransport`` / ``AsyncHttpxTransport`` send the trace and
  the gym identity with every request (extra ``httpx``);
- ``gymtrace.integrations.aiohttp``: ``aiohttp_trace_config()`` does the same for aiohttp, and
  ``instrument()`` beside the official aiohttp-client instrumentation (extra ``aiohttp``);
- ``gymtrace.integrations.asgi``: ``GymTraceMiddleware`` continues the caller's trace and identity
  in an ASGI server (Starlette, FastAPI; extra ``asgi``);
- ``gymtrace.integrations.concurrent``: ``submit``/``map``/``carry`` carry them into thread and
  process pools (standard library only);
- ``gymtrace.integrations.gymnasium``: ``TraceEnv(env)`` turns Gymnasium episodes (scalar and
  vector environments) into rollouts (extra ``gymnasium``);
- ``gymtrace.integrations.ray``: ``instrument()`` carries gym scopes into Ray tasks and actor
  methods (extra ``ray``);
- ``gymtrace.integrations.inspect_ai``: ``instrument()`` traces Inspect AI evaluations through its
  hooks (extra ``inspect-ai``);
- ``gymtrace.integrations.openai``: ``instrument()`` makes each chat completion a ``chat {model}``
  span with usage, cache hits, response ID, finish reasons and time to first chunk (extra
  ``openai``);
- ``gymtrace.integrations.nemo_gym``: NeMo Gym's wire identity (``headers()``, ``instrument()``;
  extra ``nemo-gym``).
"""
