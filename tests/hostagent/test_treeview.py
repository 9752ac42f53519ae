"""``modelcast trace``'s rendering (issue 43): the controller's trace of a real group on
the simulated fabric printed as an indented tree -- each switch once, each port it copies
to below it, each receiver at its leaf with its state -- and, between two traces, how fast
each counter rose."""

from __future__ import annotations

import re

import pytest

import topologies as T
from hostagent.treeview import find_group, render
from tests.support.controller_env import TOKEN, fabric_counters, make_env


@pytest.fixture
def traced():
    """fat-tree:4, h1 to three receivers: two traces, 4 packets sent between them."""
    topo = T.fat_tree(4)
    env = make_env(topo, token=TOKEN)
    ips = [h.ip for h in topo.hosts]
    g, _ = env.service.create_group({"model": "m", "source": ips[0], "receivers": [ips[1], ips[5], ips[12]]})
    read = fabric_counters(env).read
    before = env.service.trace(g["id"], None, read)
    for _ in range(4):
        env.delivered(g["id"])
    after = env.service.trace(g["id"], None, read)
    return env, g, before, after


def test_each_switch_once_each_port_below_it_each_receiver_at_its_leaf(traced):
    env, g, _, after = traced
    text = render(after)
    lines = text.splitlines()
    assert lines[0].startswith(f"group {g['id']}  m  {g['source']} -> {g['address']}:")
    tree = env.core.groups[g["id"]].tree
    switch_lines = [ln for ln in lines if re.match(r"\s+s\d+  in port", ln)]
    # (a switch of several receivers' paths is printed once)
    assert sorted(int(re.match(r"\s+s(\d+)", ln).group(1)) for ln in switch_lines) == sorted(tree.entries)
    assert lines[1].strip().startswith(f"s{tree.root}  in port")
    for r in after["receivers"]:
        leaf = next(ln for ln in lines if f"-> {r['ip']} " in ln)
        assert leaf.endswith("[installed]")
    # indentation follows depth: a switch two hops down is indented more than the root
    depth = {int(re.match(r"\s+s(\d+)", ln).group(1)): len(ln) - len(ln.lstrip()) for ln in switch_lines}
    assert all(depth[c] > depth[p] for c, p in tree.parent.items() if p is not None)


def test_between_two_traces_every_counter_shows_its_rate(traced):
    _, _, before, after = traced
    text = render(after, before, 2.0)
    rates = re.findall(r"\(\+([\d,]+)/s\)", text)
    assert rates and set(rates) == {"2"}  # 4 packets in 2 s at every flow and bucket
    assert "(+" not in render(after)  # (one trace: no rate)


def test_a_receiver_not_found_is_listed_with_why():
    env = make_env(token=TOKEN, unknown_hosts=("10.0.0.5",))
    g, _ = env.service.create_group({"model": "m", "source": env.ips[0], "receivers": ["10.0.0.5"]})
    text = render(env.service.trace(g["id"]))
    assert "10.0.0.5  [pending]  host 10.0.0.5 not found yet" in text
    assert "(no live counters" in text


class _Client:
    def __init__(self, groups):
        self.groups = groups

    def list_groups(self, model):
        return [g for g in self.groups if g["model"] == model]


def test_a_model_names_its_one_group_and_an_ambiguous_or_unknown_one_is_an_error():
    client = _Client([{"id": 3, "model": "a", "source": "10.0.0.1"},
                      {"id": 4, "model": "b", "source": "10.0.0.1"}, {"id": 5, "model": "b", "source": "10.0.0.2"}])
    assert find_group(client, "7") == 7 and find_group(client, "a") == 3
    with pytest.raises(ValueError, match=r"model 'b' has 2 groups: 4 \(from 10.0.0.1\), 5 \(from 10.0.0.2\)"):
        find_group(client, "b")
    with pytest.raises(ValueError, match="no group of model 'c'"):
        find_group(client, "c")
