"""Preflight: every launch starts from a clean node with enough memory, or refuses with a reason."""
