"""Example workflows and the fake external API they talk to (the README ("Inside a phase"))."""
