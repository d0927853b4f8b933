"""``phasegate token new NAME --role ROLE``: a fresh API token and the line that admits it.

The token is printed once and never stored; the line holds only its sha256, for the tokens
file (``PHASEGATE_API_TOKENS_FILE``). Rotate by adding a new line, moving callers over and
deleting the old line; revoke by deleting the line. The orchestrator notices the change.
"""

from __future__ import annotations

import click

from phasegate.access import ROLE_PATTERN
from phasegate.orchestrator.auth import LEVELS, NAME_PATTERN, new_token, token_line


@click.group()
def token() -> None:
    """API bearer tokens (PHASEGATE_API_AUTH=tokens)."""


@token.command("new")
@click.argument("name")
@click.option("--role", "roles", multiple=True, required=True,
              help="viewer, operator or admin (repeat it, or give read-policy roles too).")
def new(name: str, roles: tuple[str, ...]) -> None:
    """Print a new random token for NAME and the tokens-file line to add."""
    wanted = sorted({part for role in roles for part in role.split(",") if part})
    if not NAME_PATTERN.fullmatch(name):
        raise click.UsageError("NAME is 1-64 chars of [A-Za-z0-9_.:@-]")
    if not wanted or not all(ROLE_PATTERN.fullmatch(r) for r in wanted):
        raise click.UsageError("a role is 1-64 chars of [A-Za-z0-9_.:-]")
    if not any(r in LEVELS for r in wanted):
        raise click.UsageError(f"give at least one API role: {', '.join(LEVELS)}")
    value = new_token()
    click.echo(f"token: {value}")
    click.echo("add this line to the tokens file (PHASEGATE_API_TOKENS_FILE):")
    click.echo(token_line(name, wanted, value))
    click.echo("callers send it as 'Authorization: Bearer <token>' (the CLI: "
               "PHASEGATE_API_TOKEN); it is not shown again.", err=True)
