"""bench/wal_split.py reads pg_waldump's lines into bytes by resource manager, relation and
record, and groups indexes with their tables."""

from __future__ import annotations

from collections import Counter

from bench.wal_split import split, table

# pg_waldump's lines, as PostgreSQL 15 prints them (one line per record).
DUMP = "\n".join([
    "rmgr: Heap        len (rec/tot):     79/   791, tx:        745, lsn: 0/01A3E2F0, "
    "prev 0/01A3E2B8, desc: INSERT off 3 flags 0x00, blkref #0: rel 1663/16384/16390 blk 0",
    "rmgr: Btree       len (rec/tot):     64/    64, tx:        745, lsn: 0/01A3E608, "
    "prev 0/01A3E2F0, desc: INSERT_LEAF off 2, blkref #0: rel 1663/16384/16395 blk 1",
    "rmgr: Heap        len (rec/tot):     54/    54, tx:        746, lsn: 0/01A3E648, "
    "prev 0/01A3E608, desc: HOT_UPDATE off 1 xmax 746, blkref #0: rel 1663/16384/16400 blk 0",
    "rmgr: Transaction len (rec/tot):     34/    34, tx:        745, lsn: 0/01A3E680, "
    "prev 0/01A3E648, desc: COMMIT 2026-12-06 03:23:00.123456 UTC",
    "pg_waldump: error: error in WAL record at 0/01A3E6A8: invalid record length",
])
RELATIONS = {"16390": "outbox", "16395": "outbox_dedup_id_key"}


def test_split_adds_total_lengths_by_manager_relation_and_record() -> None:
    bytes_by = split(DUMP, RELATIONS)
    assert bytes_by == Counter({("Heap", "outbox", "INSERT"): 791,
                                ("Btree", "outbox_dedup_id_key", "INSERT_LEAF"): 64,
                                ("Heap", "16400", "HOT_UPDATE"): 54,
                                ("Transaction", "-", "COMMIT"): 34})


def test_table_puts_indexes_with_their_table_per_transition() -> None:
    text = table("t", split(DUMP, RELATIONS), transitions=2, top=10)
    assert text.startswith("t: 472 bytes per transition")
    assert "| outbox | 427.5 | 90.7% |" in text
