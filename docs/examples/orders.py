"""The quickstart's workflow (docs/quickstart.md): three phases and one recorded write step.

``tests/integration/test_docs_examples.py`` runs it with a real worker against PostgreSQL and an
SQS server, so the page cannot drift from what phasegate does.
"""

from phasegate import Context, NonRetryableError, Workflow

orders = Workflow("order-receipt", schema_version=1)


async def charge_card(order_id: str, amount: int, *, idempotency_key: str) -> dict:
    """Stands in for a payment API: a real one takes the key as an ``Idempotency-Key`` header
    and answers a repeated key with the original charge."""
    return {"order_id": order_id, "amount": amount, "charge_id": f"ch_{idempotency_key[:12]}"}


@orders.phase("price")
async def price(ctx: Context, state: dict) -> dict:
    if not state.get("items"):
        raise NonRetryableError("an order needs items")  # fails the run now, no retries
    total = sum(item["cents"] * item["qty"] for item in state["items"])
    return {**state, "total_cents": total}


@orders.phase("charge")
async def charge(ctx: Context, state: dict) -> dict:
    # A write step: recorded before and after the call, so a redone phase never charges twice.
    receipt = await ctx.step("charge_card", charge_card, state["order_id"],
                             state["total_cents"], category="write")
    return {**state, "charge": receipt}


@orders.phase("confirm")
async def confirm(ctx: Context, state: dict) -> dict:
    return {"order_id": state["order_id"], "charge_id": state["charge"]["charge_id"],
            "status": "paid"}
