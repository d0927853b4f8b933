"""The connection rules for poolers and the SQS quota a queue's attributes select."""

from __future__ import annotations

import json

import pytest

from phasegate.db import statement_cache_size
from phasegate.limits import (
    SQS_FIFO_CALLS_PER_S,
    SQS_FIFO_HT_CALLS_PER_S_MAX,
    SQS_FIFO_MESSAGES_PER_S_BATCHED,
    fifo_quota,
)
from phasegate.settings import SettingsError, is_rds_proxy, load_settings


def test_behind_a_pooler_no_statement_is_cached_whatever_the_cache_setting():
    assert statement_cache_size("transaction", 100) == 0
    # asyncpg's own cache (names per client connection) is off; phasegate names by text.
    assert statement_cache_size("pgbouncer", 100) == 0
    assert statement_cache_size("none", 100) == 100
    assert statement_cache_size("none", 0) == 0
    with pytest.raises(ValueError, match="transaction, pgbouncer, none"):
        statement_cache_size("session", 100)  # type: ignore[arg-type]


def test_pooler_setting_defaults_to_transaction_and_rejects_unknown_modes(monkeypatch):
    monkeypatch.delenv("PHASEGATE_DATABASE_POOLER", raising=False)
    assert load_settings().database_pooler == "transaction"
    monkeypatch.setenv("PHASEGATE_DATABASE_POOLER", "none")
    assert load_settings().database_pooler == "none"
    monkeypatch.setenv("PHASEGATE_DATABASE_POOLER", "pgbouncer")
    assert load_settings().database_pooler == "pgbouncer"
    monkeypatch.setenv("PHASEGATE_DATABASE_POOLER", "session")
    with pytest.raises(SettingsError) as error:
        load_settings()
    assert error.value.variable == "PHASEGATE_DATABASE_POOLER"


def test_fifo_quota_follows_the_high_throughput_attributes():
    standard = fifo_quota({"FifoQueue": "true"})
    assert standard.mode == "standard"
    assert standard.calls_per_s_per_action == SQS_FIFO_CALLS_PER_S == 300
    assert standard.messages_per_s_batched == SQS_FIFO_MESSAGES_PER_S_BATCHED == 3000
    # Only both attributes together switch the mode (AWS requires the pair).
    half = fifo_quota({"FifoQueue": "true", "DeduplicationScope": "messageGroup"})
    assert half.mode == "standard"
    high = fifo_quota({"FifoQueue": "true", "DeduplicationScope": "messageGroup",
                       "FifoThroughputLimit": "perMessageGroupId"})
    assert high.mode == "high_throughput"
    assert high.calls_per_s_per_action == SQS_FIFO_HT_CALLS_PER_S_MAX
    assert high.calls_per_s_per_group == 300


PROXY = "postgresql://phasegate:s3cret@fleet.proxy-c0ffee12.eu-west-1.rds.amazonaws.com/pg"


@pytest.mark.parametrize("mode", ["pgbouncer", "none"])
def test_named_statements_are_refused_behind_rds_proxy_naming_the_setting(monkeypatch, mode):
    monkeypatch.delenv("PHASEGATE_DATABASE_POOLER", raising=False)
    with pytest.raises(SettingsError) as error:
        load_settings(database_url=PROXY, database_pooler=mode)
    assert error.value.variable == "PHASEGATE_DATABASE_POOLER"
    assert "RDS Proxy" in error.value.problem and "use transaction" in error.value.problem
    assert "s3cret" not in str(error.value)  # the DSN (and its password) is never echoed
    # A store behind the proxy counts as much as the main database.
    with pytest.raises(SettingsError) as error:
        load_settings(database_url="postgresql://u@db.internal/pg", database_pooler=mode,
                      stores=json.dumps({"default": "postgresql://u@db.internal/pg",
                                         "eu": PROXY}))
    assert error.value.variable == "PHASEGATE_STORES"
    assert "s3cret" not in str(error.value)


def test_the_default_and_other_hosts_are_not_refused():
    assert load_settings(database_url=PROXY).database_pooler == "transaction"
    for host in ("mydb.c0ffee12.eu-west-1.rds.amazonaws.com", "pgbouncer.internal", "10.0.0.5"):
        assert load_settings(database_url=f"postgresql://u@{host}/pg",
                             database_pooler="pgbouncer").database_pooler == "pgbouncer"
    assert is_rds_proxy("postgresql://u@e1.endpoint.proxy-c0ffee12.cn-north-1"
                        ".rds.amazonaws.com.cn/pg")
    assert not is_rds_proxy("not a url at all")
