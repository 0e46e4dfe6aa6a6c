"""Live rollouts: the metrics instruments and the live markers, heartbeats and deadlines."""
