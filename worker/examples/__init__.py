"""Example workflows and the fake external API they talk to (docs/inside-the-room.md)."""
