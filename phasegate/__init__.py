"""phasegate."""
