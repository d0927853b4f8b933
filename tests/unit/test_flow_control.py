"""Flow control without a database: the tick calculator with injected times, schedule and
concurrency definitions and their errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from phasegate.concurrency import MAX_KEY_CHARS, ConcurrencyKeyError, key_for
from phasegate.orchestrator.scheduler import schedules_for
from phasegate.schedules import (
    Due,
    Schedule,
    ScheduleError,
    check_cron,
    due,
    parse_schedules,
)
from phasegate.settings import SettingsError, load_settings
from phasegate.workflow import Registry, Workflow, WorkflowDefinitionError
from tests.workflows_flow import limited, nightly


def at(hh: int, mm: int, ss: int = 0, day: int = 1) -> datetime:
    return datetime(2026, 12, day, hh, mm, ss, tzinfo=UTC)


# -- which ticks are due -------------------------------------------------------------------


def test_a_tick_on_time_fires_under_every_policy():
    for policy in ("none", "latest", "all"):
        assert due("*/15 * * * *", at(10, 30), at(10, 45, 3), policy) == Due([at(10, 45)])


def test_nothing_is_due_before_the_next_tick_and_a_tick_fires_at_its_instant():
    assert due("*/15 * * * *", at(10, 45), at(10, 59, 59)) == Due([])
    assert due("*/15 * * * *", at(10, 45), at(11, 0)) == Due([at(11, 0)])


def test_after_downtime_latest_fires_only_the_newest_missed_tick():
    assert due("*/15 * * * *", at(10, 0), at(10, 46, 30), "latest") == Due([at(10, 45)])


def test_after_downtime_all_fires_the_newest_ticks_oldest_first_up_to_the_bound():
    assert due("*/15 * * * *", at(10, 0), at(10, 46, 30), "all", 10) == \
        Due([at(10, 15), at(10, 30), at(10, 45)])
    assert due("*/15 * * * *", at(10, 0), at(10, 46, 30), "all", 2) == \
        Due([at(10, 30), at(10, 45)])


def test_after_downtime_none_skips_a_late_tick_and_keeps_it_as_the_mark():
    assert due("*/15 * * * *", at(10, 0), at(10, 46, 30), "none") == Due([], skip=at(10, 45))
    assert due("*/15 * * * *", at(10, 0), at(10, 45, 59), "none") == Due([at(10, 45)])


def test_a_year_of_minutely_downtime_is_bounded_work():
    result = due("* * * * *", at(0, 0), at(0, 0) + timedelta(days=365), "all", 5)
    assert len(result.fire) == 5 and result.fire[-1] == at(0, 0) + timedelta(days=365)


def test_ticks_are_utc_whatever_zone_the_times_come_in():
    eastern = timezone(timedelta(hours=-5))
    now = datetime(2026, 12, 1, 22, 1, tzinfo=eastern)  # 03:01 UTC next day
    assert due("0 3 * * *", at(12, 0), now) == Due([at(3, 0, day=2)])


# -- schedule definitions ------------------------------------------------------------------


def test_settings_schedules_parse_with_defaults():
    [one, two] = parse_schedules(
        '[{"workflow": "report", "cron": "0  3 * * *", "input": {"a": 1}},'
        ' {"workflow": "report", "cron": "*/5 * * * *", "name": "report-often"}]')
    assert one == Schedule("report", "report", "0 3 * * *", {"a": 1})
    assert two == Schedule("report-often", "report", "*/5 * * * *", None)
    assert parse_schedules(None) == parse_schedules("  ") == []


@pytest.mark.parametrize(("text", "problem"), [
    ("{", "not valid JSON"),
    ('{"workflow": "x"}', "expected a JSON list"),
    ('["x"]', "schedule 1 is not an object"),
    ('[{"workflow": "x", "cron": "* * * * *", "every": 5}]', "unknown fields ['every']"),
    ('[{"cron": "* * * * *"}]', "needs a workflow name"),
    ('[{"workflow": "x y", "cron": "* * * * *"}]', "needs a workflow name"),
    ('[{"workflow": "x", "cron": "61 * * * *"}]', "not a valid 5-field cron"),
    ('[{"workflow": "x", "cron": "* * * *"}]', "not a valid 5-field cron"),
    ('[{"workflow": "x", "cron": "* * * * * *"}]', "not a valid 5-field cron"),
    ('[{"workflow": "x"}]', "schedule 1: schedule must be a cron expression"),
    ('[{"workflow": "x", "cron": "* * * * *"}, {"workflow": "x", "cron": "0 * * * *"}]',
     "two different schedules are named 'x'"),
])
def test_bad_settings_schedules_are_clear_errors(text, problem):
    with pytest.raises(ScheduleError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        parse_schedules(text)


def test_a_bad_schedules_setting_names_the_variable():
    with pytest.raises(SettingsError) as caught:
        load_settings(schedules='[{"workflow": "x", "cron": "every minute"}]')
    assert caught.value.variable == "PHASEGATE_SCHEDULES"
    assert "not a valid 5-field cron" in str(caught.value)
    with pytest.raises(SettingsError) as caught:
        load_settings(schedule_catchup="some")
    assert caught.value.variable == "PHASEGATE_SCHEDULE_CATCHUP"
    assert load_settings(schedule_catchup="ALL").schedule_catchup == "all"


def test_a_workflows_own_schedule_and_settings_schedules_combine():
    registry = Registry([nightly, limited])
    both = schedules_for(registry, '[{"workflow": "other", "cron": "*/5 * * * *"}]')
    assert [(s.name, s.cron, s.input) for s in both] == [
        ("nightly", "0 3 * * *", {"report": "daily"}), ("other", "*/5 * * * *", None)]
    with pytest.raises(ScheduleError, match="two different schedules are named 'nightly'"):
        schedules_for(registry, '[{"workflow": "nightly", "cron": "*/5 * * * *"}]')


@pytest.mark.parametrize(("kwargs", "problem"), [
    ({"schedule": "every day"}, "not a valid 5-field cron"),
    ({"schedule": ""}, "must be a cron expression"),
    ({"schedule_input": {"a": 1}}, "schedule_input needs a schedule"),
    ({"schedule": "* * * * *", "schedule_input": {1, 2}}, "input is not JSON"),
    ({"max_concurrency": 2}, "max_concurrency needs a concurrency_key"),
    ({"concurrency_key": str}, "needs max_concurrency, an int >= 1"),
    ({"concurrency_key": str, "max_concurrency": 0}, "needs max_concurrency, an int >= 1"),
    ({"concurrency_key": str, "max_concurrency": True}, "needs max_concurrency"),
    ({"concurrency_key": "tenant", "max_concurrency": 1}, "must be callable"),
    ({"rate": (2, 3.0)}, "rate needs a concurrency_key"),
    ({"concurrency_key": str, "rate": 5}, "rate must be a pair"),
    ({"concurrency_key": str, "rate": (0, 3.0)}, "rate's N must be an int >= 1"),
    ({"concurrency_key": str, "rate": (True, 3.0)}, "rate's N must be an int >= 1"),
    ({"concurrency_key": str, "rate": (2, 0)}, "rate's seconds must be a number in"),
    ({"concurrency_key": str, "rate": (2, float("nan"))}, "rate's seconds must be"),
    ({"concurrency_key": str, "rate": (2, 86401)}, "rate's seconds must be"),
    ({"concurrency_key": str, "max_concurrency": 0, "rate": (2, 3.0)}, "an int >= 1"),
])
def test_bad_flow_control_definitions_fail_at_definition_time(kwargs, problem):
    with pytest.raises(WorkflowDefinitionError, match=problem):
        Workflow("w", **kwargs)


def test_a_rate_alone_or_with_a_cap():
    paced = Workflow("paced", concurrency_key=str, rate=(2, 3))
    assert (paced.max_concurrency, paced.rate) == (None, (2, 3.0))
    both = Workflow("both", concurrency_key=str, max_concurrency=4, rate=[10, 60.0])
    assert (both.max_concurrency, both.rate) == (4, (10, 60.0))
    assert Workflow("plain").rate is None


def test_cron_expressions_are_normalised():
    assert check_cron("  */5   *  * * 1-5 ") == "*/5 * * * 1-5"


# -- concurrency keys ----------------------------------------------------------------------


def test_the_key_comes_from_the_input():
    assert key_for(limited, {"tenant": "acme"}) == "acme"


@pytest.mark.parametrize(("fn", "problem"), [
    (lambda i: i["tenant"], "raised KeyError"),
    (lambda i: 42, "returned int, not str"),
    (lambda i: "", "key of 0 chars"),
    (lambda i: "k" * (MAX_KEY_CHARS + 1), f"key of {MAX_KEY_CHARS + 1} chars"),
])
def test_a_key_that_cannot_be_computed_is_refused_without_echoing_the_input(fn, problem):
    workflow = Workflow("keyed", concurrency_key=fn, max_concurrency=1)
    with pytest.raises(ConcurrencyKeyError, match=problem) as caught:
        key_for(workflow, {"secret": "hunter2"})
    assert "hunter2" not in str(caught.value)
