"""deploy/grafana/dashboards/iotgw.json against the dashboard model of Grafana 11.3 (the version
deploy/compose.yaml runs): grafana-foundation-sdk's models, generated from Grafana's own schema,
with its panel plugins' options and data source query models registered. A key a model does not
know is dropped by its parser, so every key of the file must come back out of the parsed
dashboard: a misspelt key anywhere the schema reaches (dashboard, variables, panels, their
options and field config, the Prometheus queries) fails here.

The provisioning files (deploy/grafana/provisioning) have no published schema and Grafana's
own loader ignores keys it does not know: they are linted as YAML (test_yaml.py) and checked
against the compose file and the dashboard in test_compose.py."""

from __future__ import annotations

import copy
import json
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from tests.deploy.conftest import DEPLOY, lost

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "iotgw.json"


def dashboard_losses(dashboard: dict[str, Any]) -> list[str]:
    # Without the plugins, panel options and queries are kept as opaque dictionaries.
    register_default_plugins()
    parsed = json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))
    return lost(dashboard, parsed)


def test_dashboard_meets_the_grafana_dashboard_schema() -> None:
    assert dashboard_losses(json.loads(DASHBOARD.read_text())) == []


def test_dashboard_schema_rejects_misspelt_keys() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    broken = copy.deepcopy(dashboard)
    panel = next(p for p in broken["panels"] if p["type"] == "timeseries")
    where = f"/panels/{broken['panels'].index(panel)}"
    panel["targets"][0]["legendFromat"] = panel["targets"][0].pop("legendFormat")
    panel["options"]["legend"]["placment"] = "bottom"
    panel["fieldConfig"]["defaults"]["unti"] = "s"
    broken["templating"]["list"][0]["lable"] = "x"
    assert sorted(dashboard_losses(broken)) == sorted(
        [
            f"{where}/targets/0/legendFromat: not in the schema",
            f"{where}/options/legend/placment: not in the schema",
            f"{where}/fieldConfig/defaults/unti: not in the schema",
            "/templating/list/0/lable: not in the schema",
        ]
    )
