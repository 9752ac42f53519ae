"""Who may offer and join which model, how much one host token may hold, and how long an
idle group lives (issue 46, findings 3, 5 and 7; issue 49's idle groups), through the
REST API as host agents meet it."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.policy import Quotas
from controller.service import Service
from tests.support.controller_env import R1, R2, R3, S, TOKEN, Api, make_env

HOST_TOKENS = {ip: f"token-of-{ip}-0123456789" for ip in (S, R1, R2, R3)}
MODEL = "blake3:" + "ab" * 32


def as_host(ip: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {HOST_TOKENS[ip]}"}


@pytest.fixture
def api() -> Api:
    return Api(make_env(token=TOKEN, host_tokens=HOST_TOKENS))


def offer(api: Api, ip: str, model: str = MODEL, status: int = 201) -> dict:
    return api.json("POST", "/v1/offers", {"model": model, "source": ip}, status, auth=False,
                    headers=as_host(ip))


# ---------------------------------------------------------------------- offers (finding 3)


def test_by_default_only_the_admin_offers_a_model(api):
    """Any host could offer any model id as itself, and fetchers believed it."""
    err = offer(api, R3, status=403)
    assert "ACL" in err["error"] and "POST /v1/acl" in err["error"]
    assert api.json("GET", "/v1/offers") == []
    assert api.json("POST", "/v1/offers", {"model": MODEL, "source": R3}, 201)["source"] == R3  # the admin


def test_the_most_specific_rule_decides_who_offers(api):
    api.json("POST", "/v1/acl", {"model": "*", "offer": ["10.0.0.0/24"]}, 201)  # every host, any model
    api.json("POST", "/v1/acl", {"model": "org/*", "offer": [S]}, 201)  # but org/ models: S only
    rule = api.json("POST", "/v1/acl", {"model": "org/llama", "offer": [R1, R2]}, 201)
    offer(api, R3, "other-model")
    offer(api, S, "org/mistral")
    offer(api, R3, "org/mistral", 403)
    offer(api, R1, "org/llama")
    offer(api, S, "org/llama", 403)  # the exact rule decides, not the prefix
    # one rule per pattern: posting it again replaces it (200), the id stays
    again = api.json("POST", "/v1/acl", {"model": "org/llama", "offer": []}, 200)
    assert again == {"id": rule["id"], "model": "org/llama", "offer": []}
    offer(api, R2, "org/llama", 403)
    assert [r["model"] for r in api.json("GET", "/v1/acl", auth=False)] == ["*", "org/*", "org/llama"]
    assert api.json("GET", f"/v1/acl/{rule['id']}", auth=False)["offer"] == []


def test_only_the_admin_changes_the_acl(api):
    body = {"model": MODEL, "offer": [R3]}
    api.json("POST", "/v1/acl", body, 403, auth=False, headers=as_host(R3))
    api.json("POST", "/v1/acl", body, 401, auth=False)
    rule = api.json("POST", "/v1/acl", body, 201)
    api.json("DELETE", f"/v1/acl/{rule['id']}", status=403, auth=False, headers=as_host(R3))
    assert api.call("DELETE", f"/v1/acl/{rule['id']}").status_code == 204
    api.json("GET", f"/v1/acl/{rule['id']}", status=404)
    for bad, words in (({"model": MODEL, "offer": ["10.0.0.300"]}, "ACL rule"),
                       ({"model": MODEL, "offer": "10.0.0.1"}, "AclRule schema"),
                       ({"model": MODEL, "colour": 1}, "AclRule schema")):
        assert words in api.json("POST", "/v1/acl", bad, 400)["error"]
    # (a rule's id is never given again either)
    assert api.json("POST", "/v1/acl", body, 201)["id"] == rule["id"] + 1


# ---------------------------------------------------------------------- joins (finding 7)


def test_a_join_rule_names_the_hosts_that_may_join_a_models_groups(api):
    g = api.json("POST", "/v1/groups", {"model": MODEL, "source": S}, 201, auth=False, headers=as_host(S))
    # without a join rule any host with a token joins (what the demo and labs rely on)
    api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R1}", status=200, auth=False, headers=as_host(R1))
    api.json("POST", "/v1/acl", {"model": MODEL, "join": [R2]}, 201)
    err = api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R3}", status=403, auth=False, headers=as_host(R3))
    assert "may not join" in err["error"]
    joined = api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R2}", status=200, auth=False, headers=as_host(R2))
    assert "key" in joined  # (a listed host gets the key in its join, as before)
    # a source naming receivers is held to the same rule; the admin is not
    api.json("POST", "/v1/groups", {"model": MODEL, "source": R1, "receivers": [R3]}, 403, auth=False,
             headers=as_host(R1))
    api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R3}", status=200)
    # already a member: leaving and joining again stays possible only as the rule says
    api.json("DELETE", f"/v1/groups/{g['id']}/receivers/{R1}", status=200, auth=False, headers=as_host(R1))
    api.json("PUT", f"/v1/groups/{g['id']}/receivers/{R1}", status=403, auth=False, headers=as_host(R1))


# ---------------------------------------------------------------------- quotas (finding 5)


def test_one_host_token_cannot_grow_the_state_without_bound():
    """The first review made 2,000 offers and 2,000 groups from one host token; now the
    quota's next one is a 429 with a JSON error naming the quota, and the state stops."""
    env = make_env(token=TOKEN, host_tokens=HOST_TOKENS)
    env.service.quotas = Quotas(offers=5, groups=4, receivers=6)
    api = Api(env)
    api.json("POST", "/v1/acl", {"model": "*", "offer": [R3, S]}, 201)
    for i in range(5):
        offer(api, R3, f"m{i}")
    err = offer(api, R3, "m5", status=429)
    assert err["detail"] == {"quota": "offers", "limit": 5} and "--quota-offers" in err["error"]
    offer(api, R3, "m0", status=200)  # (updating an offer it holds is no new one)
    offer(api, S, "m5")  # another host's quota is its own
    for i in range(4):
        api.json("POST", "/v1/groups", {"model": f"g{i}", "source": R1, "receivers": [R3]}, 201,
                 auth=False, headers=as_host(R3))
    err = api.json("POST", "/v1/groups", {"model": "g4", "source": R1}, 429, auth=False, headers=as_host(R3))
    assert err["detail"] == {"quota": "groups", "limit": 4}
    # receivers: 4 memberships so far (it named itself in each); 2 more joins, then 429
    others = [api.json("POST", "/v1/groups", {"model": f"o{i}", "source": S}, 201)["id"] for i in range(3)]
    for gid in others[:2]:
        api.json("PUT", f"/v1/groups/{gid}/receivers/{R3}", status=200, auth=False, headers=as_host(R3))
    err = api.json("PUT", f"/v1/groups/{others[2]}/receivers/{R3}", status=429, auth=False, headers=as_host(R3))
    assert err["detail"] == {"quota": "receivers", "limit": 6}
    api.json("PUT", f"/v1/groups/{others[2]}/receivers/{R3}", status=200)  # the admin has no quota
    # deleting frees the quota again
    mine = [g["id"] for g in api.json("GET", "/v1/groups") if g["model"].startswith("g")]
    api.call("DELETE", f"/v1/groups/{mine[0]}")
    api.json("POST", "/v1/groups", {"model": "g4", "source": R1}, 201, auth=False, headers=as_host(R3))


def test_quotas_hold_across_a_restart(tmp_path: Path):
    """Who created a group is saved with it: a restart does not reset a host's quota."""
    state = tmp_path / "state"
    env = make_env(token=TOKEN, host_tokens=HOST_TOKENS, state_path=state)
    env.service.quotas = Quotas(groups=2)
    api = Api(env)
    for i in range(2):
        api.json("POST", "/v1/groups", {"model": f"g{i}", "source": R1}, 201, auth=False, headers=as_host(R3))
    again = Service(env.core.__class__(), env.installer, state, TOKEN, host_tokens=HOST_TOKENS,
                    quotas=Quotas(groups=2))
    assert again.load() == []
    env.service = again
    api = Api(env)
    api.json("POST", "/v1/groups", {"model": "g2", "source": R1}, 429, auth=False, headers=as_host(R3))


# ---------------------------------------------------------------------- idle groups (issue 49)


class Wall:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_idle_groups_expire_unless_pinned_or_offered(tmp_path: Path):
    wall = Wall()
    env = make_env(token=TOKEN, host_tokens=HOST_TOKENS)
    svc = Service(env.core, env.installer, tmp_path / "state", TOKEN, host_tokens=HOST_TOKENS,
                  group_idle_s=3600, wall=wall)
    env.service = svc
    api = Api(env)
    idle = api.json("POST", "/v1/groups", {"model": "idle", "source": S, "receivers": [R1]}, 201)
    pinned = api.json("POST", "/v1/groups", {"model": "pinned", "source": S, "pinned": True}, 201)
    served = api.json("POST", "/v1/groups", {"model": "served", "source": S}, 201)
    api.json("POST", "/v1/offers", {"model": "served", "source": S}, 201)
    busy = api.json("POST", "/v1/groups", {"model": "busy", "source": S}, 201)
    assert pinned["pinned"] is True and idle["pinned"] is False
    wall.now += 3000
    api.json("POST", f"/v1/groups/{busy['id']}/rekey", {}, 200)  # a change restarts its clock
    wall.now += 700
    svc.flush_state(10.0)
    assert sorted(g["model"] for g in api.json("GET", "/v1/groups")) == ["busy", "pinned", "served"]
    assert env.ours(idle["id"]) == []  # (its flows and groups are gone from the switches)
    # unpinned, a pinned group expires like any other once it is idle; pinning is the source's
    api.json("DELETE", f"/v1/groups/{pinned['id']}/pin", status=403, auth=False, headers=as_host(R1))
    assert api.json("DELETE", f"/v1/groups/{pinned['id']}/pin")["pinned"] is False
    wall.now += 3700
    svc.flush_state(20.0)
    assert sorted(g["model"] for g in api.json("GET", "/v1/groups")) == ["served"]
    # the pin and the idle clock are saved with the group
    kept = api.json("PUT", f"/v1/groups/{served['id']}/pin", status=200, auth=False, headers=as_host(S))
    assert kept["pinned"] is True
    again = Service(env.core.__class__(), env.installer, tmp_path / "state", TOKEN, group_idle_s=3600, wall=wall)
    assert again.load() == [] and again.get_group(served["id"])["pinned"] is True


def test_group_idle_zero_keeps_groups_for_ever():
    wall = Wall()
    env = make_env()
    svc = Service(env.core, env.installer, group_idle_s=0, wall=wall)
    svc.create_group({"model": "m", "source": S})
    wall.now += 10 ** 8
    svc.flush_state(1.0)
    assert [g["model"] for g in svc.list_groups()] == ["m"]


def test_a_pin_is_the_sources_or_the_admins(api):
    """A receiver creating (or looking up) its sender's group cannot pin it; the source can."""
    early = api.json("POST", "/v1/groups", {"model": "m", "source": S, "pinned": True}, 201, auth=False,
                     headers=as_host(R1))
    assert early["pinned"] is False
    again = api.json("POST", "/v1/groups", {"model": "m", "source": S, "pinned": True}, 200, auth=False,
                     headers=as_host(S))
    assert again["pinned"] is True and again["id"] == early["id"]
    api.json("PUT", f"/v1/groups/{early['id']}/pin", status=403, auth=False, headers=as_host(R1))
