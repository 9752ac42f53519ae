"""The library round trip of issue 45 on OVS: a small Hugging Face model the test makes (a
config, a tokenizer file, a shard index and two safetensors shards) sits in one host's
HF cache as the hub's downloads leave it; ``modelcast serve hf://ORG/NAME`` offers it by
name, and two other hosts each run ``modelcast fetch hf://ORG/NAME --hf-cache DIR`` into a
cache of their own, knowing nothing but the name. Then, offline, with the real
libraries: ``huggingface_hub.snapshot_download(repo, revision=..., local_files_only=True)``
returns the fetched snapshot (by branch and by commit), ``scan_cache_dir()`` reports it
with no warning, and ``safetensors`` loads every tensor equal to the source's."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

import topologies as T
from lab.autoscale import served_line
from lab.fabric import Fabric
from lab.transfer import AgentRun, agent_argv
from tests.support.hfcache import check_loads, hub_names, model_files, write_hub_cache
from tests.support.lab import need_lab, need_module

pytestmark = pytest.mark.lab

REPO = "acme/toy-llm"
SERVER, FETCHERS = "h1", ("h3", "h4")


def test_a_model_served_by_name_is_fetched_by_name_into_caches_the_libraries_load(tmp_path: Path) -> None:
    need_lab()
    need_module("safetensors")
    hub = need_module("huggingface_hub")
    made = model_files(REPO, seed=45, shard_elems=1_000_000)  # two ~2 MB shards
    write_hub_cache(tmp_path / "server-cache", made, refs=("main",))
    with Fabric(T.leaf_spine(2, 2, 2), tmp_path / "lab") as fabric:
        server = AgentRun.start(fabric, SERVER, "serve", agent_argv(fabric, SERVER, [
            "serve", f"hf://{REPO}", "--hf-cache", str(tmp_path / "server-cache"), "--rate", "150"]),
            tmp_path / "serve")
        try:
            offer = served_line(server)
            assert offer["name"] == REPO and offer["revision"] == made.commit and offer["size"] == made.size
            fetches = [AgentRun.start(fabric, host, "fetch", agent_argv(fabric, host, [
                "fetch", f"hf://{REPO}", "--hf-cache", str(tmp_path / f"{host}-cache"), "--timeout", "30",
                "--patience", "120"]), tmp_path / f"fetch-{host}") for host in FETCHERS]
            for run in fetches:
                run.wait(180)
        finally:
            server.kill(signal.SIGTERM)
    assert server.returncode == 0, server.stderr_tail()
    for run in fetches:
        summary = run.summary or {}
        assert run.returncode == 0 and summary.get("ok"), f"fetch on {run.host}: {run.stderr_tail()}"
        assert summary["commit"] == made.commit and summary["model"] == offer["model"]
        cache = tmp_path / f"{run.host}-cache"
        info = hub.scan_cache_dir(cache)
        assert info.warnings == [], info.warnings
        (repo,) = info.repos
        (rev,) = repo.revisions
        assert repo.repo_id == REPO and rev.commit_hash == made.commit and rev.refs == {"main"}
        assert {f.file_name for f in rev.files} == set(made.files) and rev.size_on_disk == made.size
        assert {f.blob_path.name for f in rev.files} == set(hub_names(made).values())
        for revision in ("main", made.commit):
            snapshot = hub.snapshot_download(REPO, revision=revision, cache_dir=str(cache), local_files_only=True)
            assert snapshot == summary["snapshot"] == str(rev.snapshot_path)
        tensors = check_loads(summary["snapshot"], made)
        print(f"\n{run.host}: {len(made.files)} files, {made.size} bytes, {len(tensors)} tensors equal to the source "
              f"({summary.get('goodput_mbit', 0):.0f} Mbit/s, {summary.get('seconds', 0):.2f} s)")
