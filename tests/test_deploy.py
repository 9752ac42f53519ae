"""The Kubernetes manifests of ``deploy/``: every object validates offline against the
pinned Kubernetes version's schemas (strict: a misspelt field fails), every command a
container runs is one our CLIs accept as written, and no token or secret is ever put on
a command line or in an environment value: each ``--token-file`` (and every other secret
file) is read from a mounted Secret volume."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.support.lab import need_module

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
KUBERNETES = "1.31"  # the oldest release still supported upstream when this was pinned
MANIFESTS = sorted(DEPLOY.glob("*.yaml"))
SECRET_FILE_OPTIONS = ("--token-file", "--cluster-secret-file", "--etcd-password-file", "--key-file")
SECRET_WORDS = re.compile(r"token|secret|password|passwd|api[-_]?key", re.I)


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def pod_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = doc.get("spec") or {}
    if doc["kind"] == "Pod":
        yield spec
    elif "template" in spec:
        yield spec["template"]["spec"]


def containers(doc: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) for every container and init container of ``doc``."""
    for pod in pod_specs(doc):
        for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
            yield pod, c


def expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion, with each variable's name for its value."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def test_there_are_manifests_for_each_part():
    names = {p.name for p in MANIFESTS}
    assert {"controller.yaml", "controller-etcd.yaml", "agent-serve.yaml", "example-vllm.yaml"} <= names
    kinds = {(p.name, d["kind"]) for p in MANIFESTS for d in documents(p)}
    assert {("controller.yaml", "Deployment"), ("controller.yaml", "Service"), ("controller-etcd.yaml", "StatefulSet"),
            ("agent-serve.yaml", "DaemonSet"), ("example-vllm.yaml", "Deployment")} <= kinds


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_object_validates_against_the_pinned_kubernetes_schemas(path):
    kv = need_module("kubernetes_validate")
    docs = documents(path)
    assert docs, f"{path.name}: no objects"
    for doc in docs:
        try:
            kv.validate(doc, KUBERNETES, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{path.name}: {doc['kind']} {doc['metadata'].get('name')}: {exc}")
        assert doc["metadata"].get("namespace", "modelcast") == "modelcast" or doc["kind"] == "Namespace"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_no_token_is_passed_on_a_command_line_or_in_the_environment(path):
    for doc in documents(path):
        for pod, c in containers(doc):
            secret_mounts = {m["mountPath"].rstrip("/") for m in c.get("volumeMounts", [])
                             if any(v["name"] == m["name"] and "secret" in v for v in pod.get("volumes", []))}
            argv = [*c.get("command", []), *c.get("args", [])]
            for i, arg in enumerate(argv):
                option, eq, value = arg.partition("=")
                assert option not in ("--token", "--etcd-password", "--cluster-secret"), (path.name, c["name"], arg)
                if option in SECRET_FILE_OPTIONS:
                    value = value if eq else argv[i + 1]
                    assert any(value.startswith(m + "/") for m in secret_mounts), \
                        f"{path.name}: {c['name']} reads {option} from {value}, not from a mounted Secret"
            for var in c.get("env", []):
                if SECRET_WORDS.search(var["name"]):
                    assert "value" not in var, f"{path.name}: {c['name']} sets {var['name']} in plain text"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_modelcast_command_parses_as_written(path):
    """The agent's and the controller's own options (what Ryu takes is passed through)."""
    from hostagent.cli import build_parser

    for doc in documents(path):
        for _, c in containers(doc):
            env = {v["name"]: f"<{v['name']}>" for v in c.get("env", [])}
            argv = [expand(a, env) for a in [*c.get("command", []), *c.get("args", [])]]
            if argv[:1] == ["modelcast"]:
                build_parser().parse_args(argv[1:])  # exits 2 on an option that is not there
            elif argv[:1] == ["modelcast-controller"]:
                ours = {a.partition("=")[0] for a in argv[1:]}
                text = (ROOT / "controller" / "main.py").read_text(encoding="utf-8")
                known = set(re.findall(r'add_argument\("(--[a-z-]+)"', text))
                ryu = {"--wsapi-host", "--wsapi-port", "--ofp-tcp-listen-port", "--ofp-listen-host"}
                assert ours <= known | ryu, (path.name, sorted(ours - known - ryu))
            assert all("$(" not in a for a in argv), (path.name, c["name"], argv)  # every variable defined


def test_the_example_starts_the_server_only_after_the_fetch_into_the_cache_it_reads():
    (doc,) = [d for d in documents(DEPLOY / "example-vllm.yaml") if d["kind"] == "Deployment"]
    pod = doc["spec"]["template"]["spec"]
    (fetch,) = pod["initContainers"]
    (server,) = pod["containers"]
    args = fetch["args"]
    assert args[0] == "fetch" and args[1].startswith("hf://")
    cache = next(a.partition("=")[2] for a in args if a.startswith("--hf-cache="))
    env = {v["name"]: v.get("value") for v in server["env"]}
    assert env["HF_HUB_OFFLINE"] == "1"
    mount = {m["name"]: m["mountPath"] for m in fetch["volumeMounts"]}["hf-cache"]
    assert {m["name"]: m["mountPath"] for m in server["volumeMounts"]}["hf-cache"] == mount
    assert env["HF_HUB_CACHE"] == cache and cache.startswith(mount + "/")
    repo = args[1].removeprefix("hf://")
    assert f"--model={repo}" in server["args"]
    assert pod["hostNetwork"] is True  # the fetch joins multicast as the node's fabric address


def test_the_dockerfile_installs_what_the_manifests_run():
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    runs = " ".join(line.removeprefix("RUN ") for line in text.replace("\\\n", " ").splitlines()
                    if line.startswith("RUN "))
    assert "ryu==4.34" in runs and '".[hf]"' in runs
    images = {c["image"] for p in MANIFESTS for d in documents(p) for _, c in containers(d)
              if c["image"].startswith("modelcast:")}
    assert images == {"modelcast:0.1.0"}
    assert 'version = "0.1.0"' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
