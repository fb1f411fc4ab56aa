"""deploy/Dockerfile and docker-compose.yml: parsed and checked against the repository and
against the Compose Specification that Compose v2 reads (tests/e2e/test_deploy_compose.py:
Compose itself, the topology as local processes and the image).

``tests/compose-spec.json`` is the Compose Specification's JSON Schema
(github.com/compose-spec/compose-spec, schema/compose-spec.json at a08f8d5, Apache-2.0): the
schema Compose v2 validates a file against.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from router.server.config import load_settings
from tests.server.support import base_images, dockerfile, exec_form, healthcheck_url
from tests.support import parses
from tests.topology import (
    COMPOSE_FILE,
    REPO,
    agent_services,
    bind_mounts,
    command_of,
    compose,
    option,
    router_config_file,
)

IMAGE_SERVICES = ("router", "agent-1", "agent-2", "agent-3")


# -- the Dockerfile -----------------------------------------------------------------------------


def test_dockerfile_copies_only_files_of_the_checkout() -> None:
    copies = [i.arguments.split() for i in dockerfile() if i.keyword == "COPY"]
    local = [args for args in copies if not args[0].startswith("--from=")]
    assert local, "the package is installed from the checkout"
    for *sources, _target in local:
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: no such file in the build context"
    copied = {source for *sources, _ in local for source in sources}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert {"pyproject.toml", project["readme"], "router"} <= copied, "what the build reads"
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    for *sources, _target in local:
        for source in sources:
            assert f"!{source}" in ignored or f"!{source}/" in ignored, (
                f".dockerignore must let {source} into the build context"
            )


def test_image_is_slim_unprivileged_and_runs_acp_router() -> None:
    instructions = dockerfile()
    bases = [i.arguments.split()[0] for i in instructions if i.keyword == "FROM"]
    assert bases == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]  # build, then run: one base
    assert base_images() == {"python:3.11-slim"}
    users = [i.arguments for i in instructions if i.keyword == "USER"]
    assert users, "a USER instruction"
    assert users[-1].split(":")[0] not in ("root", "0")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    entrypoint = exec_form("ENTRYPOINT")
    assert entrypoint == ["acp-router"]
    assert entrypoint[0] in project["scripts"]
    assert parses(exec_form("CMD"))
    final = instructions[max(n for n, i in enumerate(instructions) if i.keyword == "FROM") :]
    # the run stage takes the built virtualenv and puts its acp-router on PATH
    assert "--from=build /opt/acp-router /opt/acp-router" in [i.arguments for i in final]
    assert any("PATH=/opt/acp-router/bin:$PATH" in i.arguments for i in final if i.keyword == "ENV")


def test_healthcheck_asks_healthz_on_the_router_port() -> None:
    argv = exec_form("HEALTHCHECK")
    assert argv[:2] == ["python", "-c"]
    url = urlsplit(healthcheck_url())
    assert url.path == "/healthz"
    listen = load_settings(router_config_file()).router.listen
    assert url.port == int(listen.rpartition(":")[2])
    exposed = [i.arguments for i in dockerfile() if i.keyword == "EXPOSE"]
    assert exposed == [str(url.port)]


# -- docker-compose.yml -------------------------------------------------------------------------


def test_compose_runs_the_image_with_valid_commands() -> None:
    services = compose()["services"]
    entrypoint = exec_form("ENTRYPOINT")
    for name in IMAGE_SERVICES:
        service = services[name]
        # the base is the Dockerfile's default unless PYTHON_IMAGE names another
        args = {"PYTHON_IMAGE": "${PYTHON_IMAGE:-python:3.11-slim}"}
        assert service["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile", "args": args}
        assert (REPO / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        assert "entrypoint" not in service
        command = command_of(service)
        assert parses(command), f"{name}: acp-router {' '.join(command)}"
        assert entrypoint == ["acp-router"]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert {services[name]["image"] for name in IMAGE_SERVICES} == {f"acp-router:{version}"}


@pytest.mark.parametrize("service", ["router", "agent-1"])
def test_a_bad_command_is_caught(service: str) -> None:
    # the checks above would notice a typo: the real parser refuses it
    command = command_of(compose()["services"][service])
    assert not parses([*command, "--no-such-flag"])
    assert not parses(["agnet", *command[1:]])


def test_compose_files_and_volumes_exist() -> None:
    document = compose()
    for name, service in document["services"].items():
        for target, source in bind_mounts(service).items():
            assert source.exists(), f"{name}: {source} (mounted at {target}) is not in the repo"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("./"):
                assert source in document["volumes"], f"{name}: undeclared volume {source}"


def test_compose_publishes_nothing_beyond_loopback() -> None:
    published = [
        (name, port)
        for name, service in compose()["services"].items()
        for port in service.get("ports", [])
    ]
    assert sorted(name for name, _ in published) == ["grafana", "prometheus", "router"]
    for name, port in published:
        assert isinstance(port, str), f"{name}: {port!r} (the short syntax, a string)"
        assert port.startswith("127.0.0.1:"), f"{name} is published on every interface: {port}"
    header = COMPOSE_FILE.read_text().split("\nx-image")[0]
    assert "[auth]" in header, "the file says how to give the router a token"
    assert "published on `127.0.0.1` only" in (REPO / "docs" / "operations.md").read_text()
    assert "publishes them on `127.0.0.1` only" in (REPO / "README.md").read_text()


def test_compose_router_config_loads_and_names_the_agent_services() -> None:
    services = compose()["services"]
    settings = load_settings(router_config_file())
    host, port = settings.router.address
    assert host == "0.0.0.0"  # reachable through the published port
    # ws://localhost:8765/acp (ACP_ROUTER_PORT: another port of the host)
    assert f"127.0.0.1:${{ACP_ROUTER_PORT:-8765}}:{port}" in services["router"]["ports"]
    agents = agent_services()
    assert len(agents) == len(settings.backends) == 3
    for backend in settings.backends:
        url = urlsplit(backend.url)
        command = command_of(agents[str(url.hostname)])
        assert option(command, "--id") == backend.id
        assert option(command, "--listen") == f"0.0.0.0:{url.port}"
        assert url.path == "/acp"
    stores = {option(command_of(s), "--store") for s in agents.values()}
    volumes = {tuple(s["volumes"]) for s in agents.values()}
    assert stores == {"/store"}
    assert volumes == {("store:/store",)}, "the agents share one named store volume"


def test_compose_prometheus_and_grafana_are_wired_to_the_router() -> None:
    services = compose()["services"]
    prometheus = services["prometheus"]
    mounts = bind_mounts(prometheus)
    config_path = option(
        [part for flag in prometheus["command"] for part in flag.split("=", 1)], "--config.file"
    )
    config = yaml.safe_load(mounts[config_path].read_text())
    assert [mounts[rule].name for rule in config["rule_files"]] == ["alerts.yml"]
    listen_port = load_settings(router_config_file()).router.address[1]
    [job] = config["scrape_configs"]
    assert job["static_configs"] == [{"targets": [f"router:{listen_port}"]}]

    grafana = bind_mounts(services["grafana"])
    provisioning = grafana["/etc/grafana/provisioning"]
    [datasource] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in prometheus["ports"]
    [provider] = yaml.safe_load((provisioning / "dashboards" / "acp-router.yml").read_text())[
        "providers"
    ]
    dashboards = [target for target in grafana if target.endswith(".json")]
    assert [str(Path(target).parent) for target in dashboards] == [provider["options"]["path"]]
    dashboard = json.loads(grafana[dashboards[0]].read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels
    for panel in panels:
        sources = [panel["datasource"]] + [t["datasource"] for t in panel["targets"]]
        expected = {"type": "prometheus", "uid": datasource["uid"]}
        assert all(source == expected for source in sources), panel["title"]


# -- the Compose versions people have -------------------------------------------------------

COMPOSE_SPEC = Path(__file__).resolve().parents[1] / "compose-spec.json"
#: top-level keys of the Compose Specification that Compose 1.29 refuses
NEWER_THAN_1_29 = {"name", "include", "models"}


def test_compose_file_follows_the_compose_specification() -> None:
    # what Compose v2 validates against; 1.29 knows an older subset of it
    document = compose()
    jsonschema.Draft7Validator(json.loads(COMPOSE_SPEC.read_text())).validate(document)
    assert not NEWER_THAN_1_29 & document.keys(), "Compose 1.29 refuses these top-level keys"


def test_the_docs_say_which_compose_and_which_images() -> None:
    docs = (REPO / "docs" / "operations.md").read_text()
    section = docs[docs.index("### The compose demo") : docs.index("### Kubernetes")]
    services = compose()["services"]
    images = {service["image"] for service in services.values()} | base_images()
    assert len(images) == 4  # the image built here, its base, Prometheus and Grafana
    for image in images:
        assert f"`{image}`" in section, (
            f"the compose section of docs/operations.md does not name {image}"
        )
    assert "Compose v2" in section
    assert "1.29" in section
