"""Pictures of a run: ``gymtrace timeline`` (a canvas of every episode, or Chrome trace-event JSON)
and ``gymtrace report`` (one self-contained HTML page of the run's figures)."""
