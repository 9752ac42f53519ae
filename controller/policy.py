"""Who may offer and join which model, and how much one host may hold (pure).

* **Offers** (``POST /v1/offers``) are claims a fetcher acts on, so they are not free for
  all: the admin may offer any model; a host token may offer a model only when an ACL rule
  for that model names the host under ``offer``.
* **Joins** (a host token joining a group, or naming receivers when it creates one) are
  open unless a rule for the group's model has a ``join`` list; then only the hosts listed
  (and the admin) may add receivers to that model's groups.
* A rule names one model id exactly, or every model starting with a prefix (``org/*``;
  ``*`` alone: every model); the most specific rule that says anything about offers (or
  joins) decides. Rules are managed by the admin over REST (``/v1/acl``) and saved with the
  state.
* **Quotas**: a host token holds at most ``offers`` offers, ``groups`` groups it created,
  and ``receivers`` receiver entries (in the groups it created, and its own memberships of
  others'); one more is a 429. The admin and the controller itself have none.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Iterable

from controller import settings
from controller.auth import Principal
from controller.errors import CoreError

Networks = tuple[ipaddress.IPv4Network, ...]


class TooMany(CoreError):
    """A host token's quota is used up: 429 with the quota and its limit."""

    status = 429

    def __init__(self, what: str, limit: int, who: Principal) -> None:
        super().__init__(f"{who} holds {limit} {what} already, the most one host may (--quota-{what})")
        self.detail = {"quota": what, "limit": limit}


class UnknownRule(CoreError):
    status = 404


@dataclass(frozen=True)
class Quotas:
    offers: int = 256
    groups: int = 1024
    receivers: int = 65536

    @staticmethod
    def from_settings(conf: settings.Settings) -> "Quotas":
        return Quotas(conf.quota_offers, conf.quota_groups, conf.quota_receivers)

    def check(self, who: Principal | None, what: str, used: int, adding: int = 1) -> None:
        """TooMany when a host token would hold more than its quota of ``what``."""
        if who is None or who.admin or adding <= 0:
            return
        limit = getattr(self, what)
        if used + adding > limit:
            raise TooMany(what, limit, who)


def _networks(items: Iterable[str]) -> Networks:
    return tuple(ipaddress.IPv4Network(i, strict=False) for i in items)


@dataclass(frozen=True)
class Rule:
    id: int
    model: str  # a model id, or a prefix ending in "*"
    offer: Networks | None = None  # hosts that may offer it (None: the rule says nothing)
    join: Networks | None = None  # hosts that may join its groups (None: says nothing)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Rule":
        """From the ``AclRule`` schema's shape (checked before)."""
        return Rule(int(d["id"]), str(d["model"]),
                    _networks(d["offer"]) if d.get("offer") is not None else None,
                    _networks(d["join"]) if d.get("join") is not None else None)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "model": self.model}
        for name in ("offer", "join"):
            nets = getattr(self, name)
            if nets is not None:
                out[name] = [str(n.network_address) if n.prefixlen == 32 else str(n) for n in nets]
        return out

    def matches(self, model: str) -> bool:
        if self.model.endswith("*"):
            return model.startswith(self.model[:-1])
        return model == self.model

    @property
    def specificity(self) -> tuple[bool, int]:
        """Exact beats any prefix; a longer prefix beats a shorter one."""
        return not self.model.endswith("*"), len(self.model)


class Acl:
    """The admin's rules, by id."""

    def __init__(self) -> None:
        self.rules: dict[int, Rule] = {}

    def find(self, model: str) -> Rule | None:
        """The rule written for exactly this pattern (a PUT replaces it)."""
        return next((r for r in self.rules.values() if r.model == model), None)

    def _deciding(self, model: str, kind: str) -> Networks | None:
        best: Rule | None = None
        for r in self.rules.values():
            if getattr(r, kind) is not None and r.matches(model) and (
                    best is None or r.specificity > best.specificity):
                best = r
        return getattr(best, kind) if best is not None else None

    def may_offer(self, who: Principal | None, model: str) -> bool:
        """The admin (and anonymous callers where nothing is configured) always; a host
        only when the deciding rule names it."""
        if who is None or who.admin:
            return True
        nets = self._deciding(model, "offer")
        return nets is not None and _inside(who.ip, nets)

    def may_join(self, who: Principal | None, model: str, ip: str) -> bool:
        """Whether ``who`` may add ``ip`` as a receiver of ``model``'s groups: always
        unless a rule has a ``join`` list for the model (the admin always)."""
        if who is None or who.admin:
            return True
        nets = self._deciding(model, "join")
        return nets is None or _inside(ip, nets)


def _inside(ip: str | None, nets: Networks) -> bool:
    if ip is None:
        return False
    addr = ipaddress.IPv4Address(ip)
    return any(addr in n for n in nets)
