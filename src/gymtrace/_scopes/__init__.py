"""The engine: frames, levels, steps, attempts and the scope objects the public API returns."""
