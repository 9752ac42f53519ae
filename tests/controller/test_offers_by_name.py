"""Offers found by name and revision (``GET /v1/offers?name=ORG/NAME&revision=REV``): what
``modelcast fetch hf://ORG/NAME[@REVISION]`` asks. A Hugging Face snapshot's offer
carries its commit, the refs pointing at it and its LFS files (``hf``); a revision
matches the commit or any of the refs; a plain offer of the same name is no snapshot.
The ``hf`` object is checked as the rest of an offer is, and kept across a restart."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import controller.rest as rest
from controller.core import MulticastCore
from controller.service import Service
from controller.topoview import TopologyView
from lab.fakeof import FakeFabric
from tests.support.controller_env import R1, R2, S, TOKEN, Api, FabricInstaller, make_env

NAME = "acme/toy-llm"
OLD, NEW = "a" * 40, "b" * 40


def body(source: str, model: str, commit: str, refs: list[str], name: str = NAME) -> dict[str, Any]:
    return {"model": model, "source": source, "name": name, "size": 10, "files": 2,
            "hf": {"commit": commit, "refs": refs, "lfs": ["model.safetensors"]}}


def ids(api: Api, query: str) -> list[int]:
    found = api.json("GET", "/v1/offers" + query)
    assert not list(rest.validator("OfferList").iter_errors(found))
    return [o["id"] for o in found]


def test_offers_are_found_by_name_and_by_commit_or_ref(tmp_path):
    api = Api(make_env(token=TOKEN, state_path=tmp_path / "state.json"))
    old = api.json("POST", "/v1/offers", body(S, "blake3:" + "01" * 32, OLD, ["v1"]), 201)
    new = api.json("POST", "/v1/offers", body(R1, "blake3:" + "02" * 32, NEW, ["main"]), 201)
    plain = api.json("POST", "/v1/offers", {"model": "blake3:" + "03" * 32, "source": R2, "name": NAME}, 201)
    other = api.json("POST", "/v1/offers", body(R2, "blake3:" + "04" * 32, NEW, ["main"], name="acme/other"), 201)
    assert new["hf"] == {"commit": NEW, "refs": ["main"], "lfs": ["model.safetensors"]} and "hf" not in plain
    assert ids(api, f"?name={NAME}") == [old["id"], new["id"], plain["id"]]
    assert ids(api, f"?name={NAME}&revision=main") == [new["id"]]
    assert ids(api, f"?name={NAME}&revision={OLD}") == [old["id"]]
    assert ids(api, f"?name={NAME}&revision=v1") == [old["id"]]
    assert ids(api, f"?name={NAME}&revision=dev") == []
    assert ids(api, "?revision=main") == [new["id"], other["id"]]
    assert ids(api, f"?name={NAME}&source={R1}") == [new["id"]]
    assert "unknown query parameter" in api.json("GET", "/v1/offers?rev=main", status=400)["error"]
    assert api.json("GET", "/v1/offers?revision=" + "a" * 257, status=400)["error"] == \
        "revision is longer than 256 characters"
    # the server's branch moved: its re-offer replaces the refs (and one without hf drops them)
    api.json("POST", "/v1/offers", body(S, "blake3:" + "01" * 32, OLD, ["main", "v1"]), 200)
    assert ids(api, f"?name={NAME}&revision=main") == [old["id"], new["id"]]
    # kept across a restart, hf and all
    again = Service(MulticastCore(TopologyView()), FabricInstaller(FakeFabric(api.env.topo)),
                    tmp_path / "state.json", registry=CollectorRegistry())
    assert again.load() == []
    assert again.list_offers(name=NAME, revision="main") == api.env.service.list_offers(name=NAME, revision="main")


@pytest.mark.parametrize("hf, words", [
    ({"commit": "A" * 40}, "commit"),
    ({"commit": "a" * 39}, "commit"),
    ({"refs": ["main"]}, "commit"),
    ({"commit": "a" * 40, "refs": ["../main"]}, "refs"),
    ({"commit": "a" * 40, "refs": ["x" * 300]}, "refs"),
    ({"commit": "a" * 40, "lfs": [""]}, "lfs"),
    ({"commit": "a" * 40, "extra": 1}, "extra"),
])
def test_a_malformed_snapshot_is_refused(hf, words):
    api = Api(make_env(token=TOKEN))
    err = api.json("POST", "/v1/offers", {"model": "m", "source": S, "hf": hf}, 400)
    assert words in str(err), err
    assert api.env.service.list_offers() == []
