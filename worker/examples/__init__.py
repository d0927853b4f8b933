"""Example workflows and the fake external API they talk to (docs/concepts/inside-a-phase.md)."""
