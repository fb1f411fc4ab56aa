"""deploy/kubernetes/: validated offline against the Kubernetes API schemas that
kubernetes-validate bundles, and checked against the router's own config loader and CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from router.commands.cli import build_parser
from router.server.config import Settings, load_settings
from tests.topology import REPO, compose, option

MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
#: the oldest release whose schema has the preStop ``sleep`` action, and the newest bundled
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
NAMESPACE = "acp"
IMAGE_USER = 10001  # deploy/Dockerfile: USER 10001:10001
WORKLOADS = (("Deployment", "acp-router"), ("StatefulSet", "agent"))


def objects() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for manifest in MANIFESTS:
        found.extend(doc for doc in yaml.safe_load_all(manifest.read_text()) if doc)
    return found


def one(kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def container(workload: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any]
    [found] = workload["spec"]["template"]["spec"]["containers"]
    return found


def router_settings(tmp_path: Path) -> Settings:
    """The ConfigMap's router.toml, loaded by the router's own loader."""
    path = tmp_path / "router.toml"
    path.write_text(one("ConfigMap", "acp-router")["data"]["router.toml"])
    return load_settings(path)


def port_named(container: dict[str, Any], name: str) -> int:
    [port] = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_are_valid_kubernetes_objects(version: str) -> None:
    found = objects()
    assert {o["kind"] for o in found} >= {
        "Namespace", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
        "StatefulSet", "PersistentVolumeClaim",
    }  # fmt: skip
    for manifest in found:
        kubernetes_validate.validate(manifest, version, strict=True)
        if manifest["kind"] != "Namespace":
            assert manifest["metadata"]["namespace"] == NAMESPACE, manifest["metadata"]["name"]


def test_the_validator_refuses_a_broken_manifest() -> None:
    broken = one("Deployment", "acp-router")
    broken["spec"]["replicas"] = "2"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_router_config_discovers_the_statefulset_through_its_headless_service(
    tmp_path: Path,
) -> None:
    settings = router_settings(tmp_path)
    agents = one("StatefulSet", "agent")
    service = one("Service", agents["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
    assert service["spec"]["selector"] == agents["spec"]["template"]["metadata"]["labels"]
    port = port_named(container(agents), "acp")
    assert [p["port"] for p in service["spec"]["ports"]] == [port]
    assert settings.backends == []
    [discovery] = settings.discovery
    assert discovery.dns == f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    assert (discovery.port, discovery.path, discovery.scheme) == (port, "/acp", "ws")
    assert discovery.nameserver is None  # the pod's resolver: the cluster DNS


def test_agents_run_as_backend_ids_on_a_shared_store() -> None:
    agents = one("StatefulSet", "agent")
    agent = container(agents)
    args = agent["args"]
    build_parser().parse_args(args)  # exits (fails the test) on a bad flag
    assert option(args, "--id") == "$(POD_NAME)"  # Kubernetes expands it: agent-0, agent-1 ...
    [env] = [e for e in agent["env"] if e["name"] == "POD_NAME"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert option(args, "--listen") == f"0.0.0.0:{port_named(agent, 'acp')}"
    [mount] = [m for m in agent["volumeMounts"] if m["mountPath"] == option(args, "--store")]
    [volume] = [
        v for v in agents["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    ]
    claim = one("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"], "every agent mounts the one store"
    pod = agents["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsUser"] == pod["fsGroup"] == IMAGE_USER


def test_router_deployment_probes_and_drains_within_its_grace_period(tmp_path: Path) -> None:
    settings = router_settings(tmp_path)
    deployment = one("Deployment", "acp-router")
    pod = deployment["spec"]["template"]["spec"]
    router = container(deployment)
    assert deployment["spec"]["replicas"] >= 2
    build_parser().parse_args(router["args"])
    [mount] = router["volumeMounts"]
    [volume] = pod["volumes"]
    assert volume["configMap"]["name"] == "acp-router"
    assert option(router["args"], "--config") == f"{mount['mountPath']}/router.toml"
    port = port_named(router, "acp")
    assert settings.router.address == ("0.0.0.0", port)
    assert router["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "acp"}
    assert router["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "acp"}
    # preStop runs first (the pod leaves the endpoints), then SIGTERM starts drain_seconds,
    # then clients are closed: the grace period covers all of it, with room to close
    pre_stop = router["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = settings.router.drain_seconds
    assert drain > 0
    grace = pod["terminationGracePeriodSeconds"]
    assert pre_stop + drain < grace <= pre_stop + drain + 30
    assert pod["securityContext"]["runAsUser"] == IMAGE_USER


def test_service_and_disruption_budget_select_the_router_pods() -> None:
    deployment = one("Deployment", "acp-router")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = one("Service", "acp-router")
    assert service["spec"]["selector"] == labels
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["acp"]
    budget = one("PodDisruptionBudget", "acp-router")
    assert budget["spec"]["selector"]["matchLabels"] == labels
    assert 1 <= budget["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    scrape = f":{annotations['prometheus.io/port']}{annotations['prometheus.io/path']}"
    assert scrape == f":{port_named(container(deployment), 'acp')}/metrics"


def test_pods_run_the_image_compose_builds() -> None:
    images = {container(one(kind, name))["image"] for kind, name in WORKLOADS}
    assert images == {compose()["services"]["router"]["image"]}
