"""The readers of finished traces: outcomes, stats, check, render, Jaeger, live view, pass@k, compare."""
