"""The fence: every use of private OpenTelemetry names, with its probe and public fallback (see
``fastpaths``)."""
