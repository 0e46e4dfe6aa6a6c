"""Integrations with the libraries RL and evaluation teams run: one module per library, each an
optional extra (``pip install 'gymtrace[httpx]'``), each importing only the public gymtrace API
and its own library. Importing this package imports none of them.

- ``gymtrace.integrations.httpx``: ``HttpxTransport`` / ``AsyncHttpxTransport`` send the trace and
  the gym identity with every request (extra ``httpx``);
- ``gymtrace.integrations.aiohttp``: ``aiohttp_trace_config()`` does the same for aiohttp (extra
  ``aiohttp``);
- ``gymtrace.integrations.asgi``: ``GymTraceMiddleware`` continues the caller's trace and identity
  in an ASGI server (Starlette, FastAPI; extra ``asgi``);
- ``gymtrace.integrations.concurrent``: ``submit``/``map``/``carry`` carry them into thread and
  process pools (standard library only).
"""
