"""Records as traces: ``gymtrace import nemo-gym|atif|inspect``.

One module per format turns what a record holds into the spans a live gymtrace trace has
(``_build`` lays out IDs and times the same way for every format; ``_write`` appends them to a file
of OTLP/JSON lines or sends them to an OTLP/HTTP endpoint).
"""
