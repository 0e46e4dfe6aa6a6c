"""The model: names' values, settings, IDs, failures, the outcome rule, errors, span data.

Plain Python: nothing here imports OpenTelemetry's SDK, and nothing here imports the rest of
gymtrace, so every other part can rely on it."""
