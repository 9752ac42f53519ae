"""Hugging Face names and the cache layout (hostagent.hf): names parsed as the hub's rules
say, a snapshot resolved offline from a cache laid out as the hub's downloads leave it,
blobs named as the hub names them, a snapshot installed so that huggingface_hub's own
``snapshot_download(local_files_only=True)`` and ``scan_cache_dir`` accept it, and a
fetch killed at any step leaving nothing a loader picks up. The loopback round trip at
the end serves ``hf://`` from one cache and fetches it into another in-process; the OVS
lab run is tests/lab/test_hf_cache.py."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hostagent import hf
from hostagent.hffetch import fetch_hf
from tests.support.hfcache import HfModel, check_loads, hub_names, model_files, write_hub_cache
from tests.support.lab import need_module

hub = need_module("huggingface_hub")
from huggingface_hub import scan_cache_dir, snapshot_download  # noqa: E402
from huggingface_hub.errors import LocalEntryNotFoundError  # noqa: E402
from huggingface_hub.utils.sha import git_hash, sha_fileobj  # noqa: E402

REPO = "acme/toy-llm"
_PART = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_-]{0,10}[A-Za-z0-9])?", fullmatch=True).filter(
    lambda part: "--" not in part)  # (the hub refuses '--' in an id: test_an_invalid_name_is_refused)


# ----------------------------------------------------------------------------- names


@given(org=st.none() | _PART, name=_PART, rev=st.none() | st.lists(_PART, min_size=1, max_size=3).map("/".join))
def test_a_valid_name_parses_back_to_itself(org, name, rev):
    text = "hf://" + (f"{org}/" if org else "") + name + (f"@{rev}" if rev else "")
    ref = hf.parse_hf(text)
    assert str(ref) == text and ref.repo == ((f"{org}/" if org else "") + name) and ref.revision == rev
    assert ref.wanted == (rev or "main")


@pytest.mark.parametrize("bad", [
    "acme/toy", "hf://", "hf://acme/", "hf:///toy", "hf://a/b/c", "hf://acme--x/toy", "hf://acme/to..y",
    "hf://-acme/toy", "hf://acme/toy@", "hf://acme/toy@../../etc", "hf://acme/toy@refs//pr", "hf://acme/toy@/main",
    "hf://acme/toy@main/", "hf://acme/to y", "hf://acme/toy@ma in",
])
def test_names_the_hub_would_refuse_are_refused(bad):
    with pytest.raises(ValueError):
        hf.parse_hf(bad)


def test_the_cache_is_found_where_huggingface_hub_looks():
    assert hf.hub_cache("/x", {"HF_HUB_CACHE": "/y"}) == "/x"
    assert hf.hub_cache(None, {"HF_HUB_CACHE": "/y", "HF_HOME": "/z"}) == "/y"
    assert hf.hub_cache(None, {"HF_HOME": "/z"}) == "/z/hub"
    assert hf.hub_cache(None, {"XDG_CACHE_HOME": "/c"}) == "/c/huggingface/hub"
    assert hf.repo_folder("/c", "acme/toy") == "/c/models--acme--toy"
    assert hf.repo_folder("/c", "gpt2") == "/c/models--gpt2"


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=5000))
def test_blob_names_are_the_hubs(tmp_path, data):
    """The same names huggingface_hub computes: git's blob sha1, sha256 for LFS."""
    path = tmp_path / "f"
    path.write_bytes(data)
    assert hf.blob_name(str(path), lfs=False) == git_hash(data)
    assert hf.blob_name(str(path), lfs=True) == sha_fileobj(io.BytesIO(data)).hex()


# ----------------------------------------------------------------------------- serving side


@pytest.fixture(scope="module")
def made() -> HfModel:
    return model_files(REPO, seed=45, shard_elems=20_000)


def test_a_snapshot_resolves_offline_by_branch_tag_or_commit(tmp_path, made):
    write_hub_cache(tmp_path, made, refs=("main", "v1.0"))
    for rev in (None, "main", "v1.0", made.commit):
        snap = hf.resolve_local(hf.HfRef(REPO, rev), str(tmp_path))
        assert snap.commit == made.commit and snap.refs == ("main", "v1.0")
        assert snap.lfs == made.lfs and Path(snap.path) == tmp_path / f"models--acme--toy-llm/snapshots/{made.commit}"
        assert snap.offer_hf() == {"commit": made.commit, "refs": ["main", "v1.0"], "lfs": list(made.lfs)}
    with pytest.raises(hf.TransferError, match=f"holds {made.commit[:12]} \\(main, v1.0\\)"):
        hf.resolve_local(hf.HfRef(REPO, "dev"), str(tmp_path))
    with pytest.raises(hf.TransferError, match="acme/other is not in the Hugging Face cache"):
        hf.resolve_local(hf.HfRef("acme/other"), str(tmp_path))
    with pytest.raises(hf.TransferError, match="no Hugging Face cache"):
        hf.resolve_local(hf.HfRef(REPO), str(tmp_path / "nowhere"))


def test_a_corrupted_repository_is_refused_with_the_caches_own_words(tmp_path, made):
    snap = write_hub_cache(tmp_path, made)
    os.unlink(Path(snap).resolve().parent.parent / "blobs" / hub_names(made)["config.json"])
    with pytest.raises(hf.TransferError, match="Blob missing"):
        hf.resolve_local(hf.HfRef(REPO), str(tmp_path))


# ----------------------------------------------------------------------------- fetching side


def offer(oid: int, model: str, commit: str, refs: list[str], name: str = REPO) -> dict:
    return {"id": oid, "model": model, "source": f"10.0.0.{oid}", "name": name,
            "hf": {"commit": commit, "refs": refs, "lfs": []}}


def test_the_offer_picked_is_the_content_most_servers_hold():
    a, b = "a" * 40, "b" * 40
    offers = [offer(1, "blake3:old", a, []), offer(2, "blake3:new", b, ["main"]), offer(3, "blake3:new", b, ["main"]),
              offer(4, "blake3:other", a, ["main"]), {"id": 5, "model": "blake3:plain", "name": REPO, "source": "x"},
              offer(6, "blake3:elsewhere", b, ["main"], name="acme/other")]
    assert hf.pick_offer(offers, hf.HfRef(REPO))["id"] == 2  # two servers hold main at b, one at a
    assert hf.pick_offer(offers, hf.HfRef(REPO, a))["id"] == 1  # a commit: either content of a; earliest
    assert hf.pick_offer(offers[3:], hf.HfRef(REPO, "main"))["id"] == 4
    assert hf.pick_offer(offers, hf.HfRef(REPO, "dev")) is None
    assert hf.pick_offer(offers[4:5], hf.HfRef(REPO)) is None  # a plain directory of that name is not a snapshot


def stage(cache: Path, made: HfModel, files: dict[str, bytes] | None = None) -> tuple[str, str]:
    """What a verified receive leaves: the model's files in the staging directory."""
    folder = hf.repo_folder(str(cache), made.repo)
    hf.prepare_repo(folder)
    staged = os.path.join(folder, hf.INCOMING, made.commit)
    for rel, data in (files or made.files).items():
        os.makedirs(os.path.dirname(os.path.join(staged, rel)), exist_ok=True)
        Path(staged, rel).write_bytes(data)
    return folder, staged


def loader_sees(cache: Path, made: HfModel, revision: str = "main") -> str:
    """What a loader gets offline (LocalEntryNotFoundError: nothing), after checking
    that the cache's own scan finds nothing wrong."""
    info = scan_cache_dir(cache)
    assert info.warnings == [], info.warnings
    return snapshot_download(made.repo, revision=revision, cache_dir=str(cache), local_files_only=True)


def test_an_installed_snapshot_is_what_huggingface_hub_and_safetensors_read(tmp_path, made):
    folder, staged = stage(tmp_path, made)
    snap = hf.install_snapshot(folder, made.commit, staged, made.lfs)
    hf.write_ref(folder, "main", made.commit)
    assert loader_sees(tmp_path, made) == snap == loader_sees(tmp_path, made, made.commit)
    check_loads(snap, made)
    assert sorted(os.listdir(os.path.join(folder, "blobs"))) == sorted(hub_names(made).values())
    for rel, name in hub_names(made).items():
        assert os.readlink(os.path.join(snap, rel)) == f"../../blobs/{name}"
    (repo,) = scan_cache_dir(tmp_path).repos
    (rev,) = repo.revisions
    assert repo.repo_id == made.repo and rev.refs == {"main"} and rev.nb_files == len(made.files)
    assert rev.size_on_disk == made.size
    assert Path(folder, "refs", "main").read_bytes() == made.commit.encode()  # no newline, as the hub writes
    assert not os.path.exists(staged)


_PATH = st.lists(st.from_regex(r"[a-z0-9_][a-z0-9_.-]{0,8}", fullmatch=True).filter(lambda p: p not in (".", "..")),
                 min_size=1, max_size=3).map("/".join)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=st.dictionaries(_PATH, st.binary(max_size=300), min_size=1, max_size=8), data=st.data())
def test_any_tree_installs_with_relative_links_the_cache_accepts(tmp_path_factory, tree, data):
    """Nested paths, empty and duplicate contents (one blob, several links), any LFS subset."""
    names = sorted(tree)
    if any(a != b and b.startswith(a + "/") for a in names for b in names):  # a file and a directory of one name
        return
    made = HfModel("acme/tree", hashlib.sha1(repr(sorted(tree.items())).encode()).hexdigest(), dict(tree),
                   lfs=tuple(data.draw(st.lists(st.sampled_from(names), unique=True))))
    cache = tmp_path_factory.mktemp("cache")
    folder, staged = stage(cache, made)
    snap = hf.install_snapshot(folder, made.commit, staged, made.lfs)
    hf.write_ref(folder, "main", made.commit)
    assert loader_sees(cache, made) == snap
    for rel, name in hub_names(made).items():
        link = os.path.join(snap, rel)
        assert not os.path.isabs(os.readlink(link)) and Path(link).resolve().name == name
        assert Path(link).read_bytes() == tree[rel]


@pytest.mark.parametrize("dies_at", ["blobs", "snapshot", "rename", "ref"])
def test_a_fetch_killed_at_any_step_leaves_nothing_a_loader_picks_up(tmp_path, made, dies_at):
    class Killed(Exception):
        pass

    def step(what: str) -> None:
        if what == dies_at:
            raise Killed(what)

    folder, staged = stage(tmp_path, made)
    if dies_at != "ref":
        with pytest.raises(Killed):
            hf.install_snapshot(folder, made.commit, staged, made.lfs, step=step)
        for revision in ("main", made.commit):
            with pytest.raises(LocalEntryNotFoundError):
                loader_sees(tmp_path, made, revision)
        assert os.listdir(os.path.join(folder, "snapshots")) == []
    else:  # the snapshot is in place, the ref not yet written: only the commit finds it, and whole
        snap = hf.install_snapshot(folder, made.commit, staged, made.lfs)
        with pytest.raises(LocalEntryNotFoundError):
            loader_sees(tmp_path, made)
        check_loads(loader_sees(tmp_path, made, made.commit), made)
    # the next fetch receives again and installs over what was left
    shutil.rmtree(staged, ignore_errors=True)
    folder, staged = stage(tmp_path, made)
    snap = hf.install_snapshot(folder, made.commit, staged, made.lfs)
    hf.write_ref(folder, "main", made.commit)
    check_loads(loader_sees(tmp_path, made), made)
    assert snap == loader_sees(tmp_path, made)


def test_a_snapshot_is_kept_only_when_whole(tmp_path, made):
    folder, staged = stage(tmp_path, made)
    hf.install_snapshot(folder, made.commit, staged, made.lfs)
    n, size = len(made.files), made.size
    assert hf.find_snapshot(folder, made.commit, n, size) is not None
    assert hf.find_snapshot(folder, made.commit, n + 1, size) is None  # a partial snapshot (one file fetched)
    assert hf.find_snapshot(folder, "c" * 40, n, size) is None
    os.unlink(os.path.join(folder, "blobs", hub_names(made)["config.json"]))
    assert hf.find_snapshot(folder, made.commit, n, size) is None  # a dangling link


def test_a_snapshot_of_the_same_commit_is_replaced_in_one_step(tmp_path, made):
    """A partial snapshot (a loader fetched one file) is exchanged for the whole one."""
    folder, staged = stage(tmp_path, made, {"config.json": made.files["config.json"]})
    hf.install_snapshot(folder, made.commit, staged, ())
    folder, staged = stage(tmp_path, made)
    snap = hf.install_snapshot(folder, made.commit, staged, made.lfs)
    hf.write_ref(folder, "main", made.commit)
    check_loads(loader_sees(tmp_path, made), made)
    assert sorted(os.listdir(snap)) == sorted(made.files)


@pytest.mark.parametrize("bad", ["a" * 40, "../x", "", "refs//pr"])
def test_a_ref_is_a_branch_or_tag_name(tmp_path, bad):
    with pytest.raises(ValueError):
        hf.write_ref(str(tmp_path), bad, "a" * 40)


def test_a_ref_may_be_nested(tmp_path):
    hf.write_ref(str(tmp_path), "refs/pr/1", "a" * 40)
    assert (tmp_path / "refs" / "refs" / "pr" / "1").read_text() == "a" * 40


# ----------------------------------------------------------------------------- loopback round trip


def test_serve_by_name_and_fetch_by_name_into_another_cache_on_loopback(tmp_path, monkeypatch):
    """``serve hf://`` from one cache, ``fetch hf://`` into another (the fake controller,
    in-process, loopback): the offer carries the name and commit; the fetched cache is
    one huggingface_hub and safetensors read; a second fetch finds the snapshot whole
    and only checks it."""
    from hostagent import ReceiveOptions, SendOptions, serve
    from hostagent.control import ControllerClient
    from tests.support.agents import LOOPBACK, FakeController, loopback_group

    monkeypatch.setenv("MODELCAST_CACHE_DIR", str(tmp_path / "digests"))
    made = model_files(REPO, seed=7, shard_elems=60_000)
    write_hub_cache(tmp_path / "server", made, refs=("main",))
    group, port = loopback_group()
    events: list = []
    stop = threading.Event()
    opts = serve.ServeOptions(controller="", ip=LOOPBACK, poll=0.05, hf_cache=str(tmp_path / "server"),
                              send=SendOptions(interface=LOOPBACK, ttl=0, rate_mbit=200, chunk_size=65536,
                                               insecure=True, poll=0.1, wait_timeout=5, timeout=10),
                              rounds=serve.RoundSettings(quiet_s=0.2, max_wait_s=0.5))
    with FakeController(port, pending_polls=0, address=group) as ctl:
        opts.controller = ctl.url
        server = threading.Thread(target=serve.serve, args=([f"hf://{REPO}"], opts, stop),
                                  kwargs={"on_event": events.append})
        server.start()
        try:
            fetch_opts = ReceiveOptions(controller=ctl.url, ip=LOOPBACK, interface=LOOPBACK, source="", timeout=10,
                                        insecure=True)
            got = fetch_hf(hf.HfRef(REPO), str(tmp_path / "node"), fetch_opts, patience=60)
            (offer,) = ControllerClient(ctl.url).offers()
            again = fetch_hf(hf.HfRef(REPO, made.commit), str(tmp_path / "node"), fetch_opts, patience=60)
        finally:
            stop.set()
            server.join(30)
    assert not server.is_alive()
    (served,) = [e for e in events if isinstance(e, serve.Served)]
    assert served.name == REPO and served.revision == made.commit and served.size == made.size
    assert offer["name"] == REPO and offer["hf"] == {"commit": made.commit, "refs": ["main"], "lfs": list(made.lfs)}
    assert got.ok and got.commit == made.commit and got.model == offer["model"] and not got.had_it
    assert got.result is not None and got.result.content_id == offer["model"]
    assert loader_sees(tmp_path / "node", made) == got.snapshot
    check_loads(got.snapshot, made)
    assert again.ok and again.had_it and again.result is None and again.snapshot == got.snapshot
    assert sorted(os.listdir(Path(got.snapshot).parent.parent / "blobs")) == sorted(hub_names(made).values())
