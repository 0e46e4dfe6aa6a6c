"""The readers of finished traces: outcomes, check, render, Jaeger, live view, pass@k, compare."""
