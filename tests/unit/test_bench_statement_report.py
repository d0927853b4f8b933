"""The statement costs' paired tables (bench/statement_costs_report.py): ratios round by round."""

from __future__ import annotations

from bench.statement_costs_report import _paired, markdown


def figures(wall: float, server: float) -> dict[str, float]:
    return {"wall_us": wall, "client_cpu_us": 50.0, "server_cpu_us": server, "wal_bytes": 500.0}


def test_the_cache_section_pairs_each_round_of_one_mode_with_the_same_round_of_the_other():
    rounds = {"hop, pooler transaction": [figures(400, 200), figures(800, 100)],
              "hop, pooler none": [figures(300, 150), figures(400, 90)]}
    table = _paired(rounds, "transaction", "none", what="pooler")
    # Per-round ratios 0.75 and 0.5 for wall (median 0.625), 0.75 and 0.9 for server CPU:
    # not the ratio of the medians (350 / 600 = 0.583, 120 / 150 = 0.8).
    assert "| hop | 0.625 | 1.000 | 0.825 | 1.000 | 2 |" in table
    assert "pooler none ÷ pooler transaction" in table


def test_the_schema_comparisons_keep_their_labels():
    rounds = {"hop, schema v28": [figures(400, 200)], "hop, schema newest": [figures(200, 100)]}
    assert "| hop | 0.500 | 1.000 | 0.500 | 1.000 | 1 |" in _paired(rounds, "v28")


def test_a_cache_report_renders_every_mode_and_each_named_mode_over_the_default():
    rounds = {"hop, pooler transaction": [figures(400, 200)],
              "hop, pooler pgbouncer": [figures(320, 160)],
              "hop, pooler none": [figures(300, 150)]}
    report = {"cache_rounds": rounds,
              "cache": {label: v[0] for label, v in rounds.items()}}
    text = markdown(report)
    assert "| hop, pooler transaction | 400 | 50 | 200 |" in text
    assert "pooler pgbouncer ÷ pooler transaction" in text
    assert "| hop | 0.800 | 1.000 | 0.800 | 1.000 | 1 |" in text
    assert "pooler none ÷ pooler transaction" in text
    assert "| hop | 0.750 | 1.000 | 0.750 | 1.000 | 1 |" in text


def test_a_cache_report_of_an_earlier_run_renders_the_modes_it_has():
    rounds = {"hop, pooler transaction": [figures(400, 200)],
              "hop, pooler none": [figures(300, 150)]}
    text = markdown({"cache_rounds": rounds,
                     "cache": {label: v[0] for label, v in rounds.items()}})
    assert "pooler none ÷ pooler transaction" in text
    assert "pgbouncer" not in text
