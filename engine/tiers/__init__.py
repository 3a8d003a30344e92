"""The engine's side of the lower tiers: what tierd holds for us, and the client that asks it."""
