"""The seeded fault-injection suite: ``python -m bench.chaos --seed N --workflows N [--long]``.

Kills, restarts and starves a real worker fleet on purpose and then checks the system-wide
invariants I1-I7 from the database and the downstream ledger (see bench/chaos/invariants.py
and docs/reliability.md).
"""
