"""The SDK wing: configure(), lifecycle, sampler, the export queue and process, OTLP, backends."""
