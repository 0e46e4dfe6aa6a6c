"""NeMo Gym: its stack traced with no code, and its wire identity for code you own.

**The stack as it is** (nemo-gym 0.7.0): ``opentelemetry-instrument gym env start ...`` and
``opentelemetry-instrument gym eval run ...`` run :func:`instrument_stack` in every NeMo Gym process
(through :mod:`gymtrace.integrations.autoinstrument`): each ``/run`` row is a rollout named by NeMo
Gym's key, a resume pass the next attempt of it, a task's repeats one group, identity kept inside
the gym (docs/integrations/nemo-gym.md). :func:`rollout_identity`, :func:`run_id_for_output`,
:func:`group_id_for`, :func:`trace_id_for` and :func:`span_id_for` are the one mapping from what
NeMo Gym sends or stores to gymtrace's IDs, shared with ``gymtrace import nemo-gym``.

**Headers, body fields and path prefix** for the current gym scope, for code you own:

NeMo Gym servers identify one execution by two headers sent together (a server answers 409
``execution_identity_mismatch`` when only one is present)::

    x-nemo-gym-rollout-id: <rollout ID>        x-nemo-gym-attempt-index: <attempt, 0-based>

by body fields ``_ng_rollout_id``, ``_ng_task_index``, ``_ng_rollout_index``,
``_ng_attempt_index``, and by a path prefix ``/ng-rollout/<key>/...`` where ``<key>`` is the
rollout ID at attempt 0 and ``{id}-a{n}`` after that (gymtrace's ``gym.episode.id``).

Example::

    import gymtrace.integrations.nemo_gym as nemo_gym

    nemo_gym.instrument()                      # httpx and aiohttp requests in gym scopes carry them
    with gymtrace.rollout(rollout_id="t-7-r0", task_id="t-7", repeat=0), gymtrace.episode():
        httpx.post(f"{env_url}/step", json=action)         # + the two headers
        nemo_gym.headers()                                  # or add them yourself

``instrument(body=True, path=True)`` also adds the body fields to JSON bodies and the path prefix;
``instrument(aliases=True)`` records NeMo Gym's own attribute names beside gymtrace's
(``nemo.gym.rollout.id`` = the attempt-qualified key, ``nemo.gym.run.id``, ``nemo.gym.task.id``)
so one Jaeger search finds both. In a server, the ASGI middleware
(:class:`gymtrace.integrations.asgi.GymTraceMiddleware`) then reads the two headers when a request carries
no believed gym baggage, so a NeMo Gym client's request runs in its rollout and attempt. NeMo Gym
headers carry no signature: they are believed only under ``GYMTRACE_TRUST_IDENTITY=all``.

**IDs.** NeMo Gym IDs must match ``^[A-Za-z0-9][A-Za-z0-9._-]*$``. A gymtrace rollout ID that
matches and contains no ``__`` is sent as it is; any other becomes ``x__`` followed by its UTF-8
bytes, with every byte outside ``A-Za-z0-9.-`` written as ``_`` and two upper-case hex digits
(``"t-1/r0"`` → ``"x__t-1_2Fr0"``). :func:`from_nemo_id` reverses it; the mapping is one-to-one
because a passed-through ID never contains ``__`` and an encoded one always starts with ``x__``.

The package, by role: :mod:`.identity` (IDs), :mod:`.client` (headers, body fields, path prefix and
:func:`instrument` for code you own), :mod:`.wire` (NeMo Gym's bodies read), :mod:`.passes` (the
driver's passes over one output), :mod:`.agent` (an agent's invocation, turns and steps),
:mod:`.server` (the middleware every server gets) and :mod:`.stack` (:func:`instrument_stack`).
"""

from __future__ import annotations

from gymtrace.integrations.nemo_gym.client import (
    alias_attributes,
    body_fields,
    headers,
    identity_from_headers,
    instrument,
    path_prefix,
    uninstrument,
)
from gymtrace.integrations.nemo_gym.identity import (
    NEMO_ID,
    RolloutIdentity,
    from_nemo_id,
    group_id_for,
    identity_from_key,
    process_service_name,
    rollout_identity,
    run_id_for_output,
    span_id_for,
    to_nemo_id,
    trace_id_for,
)
from gymtrace.integrations.nemo_gym.passes import OutputPasses, output_passes, pass_log_path
from gymtrace.integrations.nemo_gym.server import (
    NeMoGymServerMiddleware,
    _record_server_error,  # noqa: F401
)
from gymtrace.integrations.nemo_gym.stack import instrument_stack, uninstrument_stack
from gymtrace.integrations.nemo_gym.wire import _function_calls, _usage_attributes  # noqa: F401

# _record_server_error, _function_calls, _usage_attributes: read by tests/test_nemo_gym_wire.py here,
# where they were before the package was split by role.
__all__ = [
    "NEMO_ID",
    "NeMoGymServerMiddleware",
    "OutputPasses",
    "output_passes",
    "pass_log_path",
    "group_id_for",
    "identity_from_key",
    "instrument_stack",
    "process_service_name",
    "span_id_for",
    "uninstrument_stack",
    "RolloutIdentity",
    "rollout_identity",
    "run_id_for_output",
    "trace_id_for",
    "alias_attributes",
    "body_fields",
    "from_nemo_id",
    "headers",
    "identity_from_headers",
    "instrument",
    "path_prefix",
    "to_nemo_id",
    "uninstrument",
]
