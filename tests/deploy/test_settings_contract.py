"""The chart speaks the package's settings contract: every PHASEGATE_* variable it sets is a
field of phasegate.settings.Settings, and what each container gets loads without error."""

from __future__ import annotations

import pytest

from phasegate.settings import ENV_PREFIX, Settings, load_settings
from tests.deploy import chart

SCENARIOS = [p.name.removesuffix("-values.yaml") for p in chart.scenarios()]
DUMMY_DSN = "postgresql://user@db:5432/phasegate"


def command_options(container: dict) -> set[str]:
    """Variables the container's `phasegate` command reads as options, not as Settings
    (e.g. `phasegate orchestrator --fleet-deployment`, PHASEGATE_FLEET_DEPLOYMENT)."""
    from phasegate.cli import main

    command = main.commands[container["args"][0]]
    names: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None)
        names.update([envvar] if isinstance(envvar, str) else envvar or [])
    return names


def container_settings(rendered: chart.Rendered, container: dict) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        (cm,) = [c for c in rendered.of_kind("ConfigMap") if c["metadata"]["name"] == name]
        env.update(cm["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var["name"] == "PHASEGATE_DATABASE_URL":
            env[var["name"]] = DUMMY_DSN  # from a Secret at run time
        else:
            env[var["name"]] = "from-the-downward-api"
    return {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_variable_is_a_setting_and_loads(scenario, rendered):
    r = rendered[scenario]
    fields = set(Settings.model_fields)
    for name, pod in r.pod_specs():
        for container in pod["containers"]:
            env = container_settings(r, container)
            options = command_options(container)
            env = {k: v for k, v in env.items() if k not in options}
            unknown = [k for k in env if k.removeprefix(ENV_PREFIX).lower() not in fields]
            assert unknown == [], f"{name}: not settings: {unknown}"
            settings = load_settings(**{k.removeprefix(ENV_PREFIX).lower(): v
                                        for k, v in env.items()})
            assert settings.database_url == DUMMY_DSN


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_startup_probe_outlasts_the_cold_start_wait(scenario, rendered):
    """The worker retries Postgres and SQS for startup_timeout_s before giving up; the startup
    probe must not kill it earlier."""
    r = rendered[scenario]
    (container,) = r.one("Deployment", "-worker")["spec"]["template"]["spec"]["containers"]
    settings = load_settings(**{k.removeprefix(ENV_PREFIX).lower(): v
                                for k, v in container_settings(r, container).items()})
    probe = container["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= settings.startup_timeout_s
