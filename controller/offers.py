"""Offers and the ACL (a part of ``controller.service.Service``): what ``modelcast serve``
publishes (docs/serving.md), who may publish which model, and the admin's rules
(``controller.policy``).

An offer is checked as a REST body is (``controller.state.offer_fields``: the OpenAPI
schema's maxima, a printable model, a host's address), so what is accepted is what a
restart restores. Offer and rule ids come from counters saved with the state: an id is
never given twice, so a server withdrawing "its" id never removes another's offer.
"""

from __future__ import annotations

import logging
from typing import Any

from controller.auth import ADMIN, Forbidden, Principal, check_admin, check_source
from controller.errors import CoreError, UnknownOffer
from controller.policy import Acl, Quotas, Rule, UnknownRule
from controller.schema import check
from controller.state import OFFER, RULE, offer_fields

log = logging.getLogger("modelcast.service")


def _at(offer: dict[str, Any], revision: str) -> bool:
    """The offer is a Hugging Face snapshot of ``revision``: its commit, or a ref to it."""
    hf = offer.get("hf")
    return hf is not None and (hf["commit"] == revision or revision in hf["refs"])


class Offers:
    """Offers and ACL rules over the service's ``offers`` (and their ``offer_index``),
    ``acl``, ``quotas`` and ``next_ids``."""

    offers: dict[int, dict[str, Any]]
    offer_index: dict[tuple[str, str], int]  # (model, source) -> its offer's id
    acl: Acl
    quotas: Quotas
    next_ids: dict[str, int]

    # -- offers ------------------------------------------------------------------------
    def create_offer(self, body: dict[str, Any], who: Principal | None = ADMIN
                     ) -> tuple[dict[str, Any], bool]:
        """Register that ``source`` serves ``model``, or update its offer of it (created
        False: a restarted server re-registers). The admin may offer any model; a host
        only as itself, a model an ACL rule lets it offer, and up to its quota."""
        fields = offer_fields(body)
        model, source = fields["model"], fields["source"]
        check_source(who, source, "offer models from it")
        if not self.acl.may_offer(who, model):
            raise Forbidden(f"{who} may not offer model {model!r:.80}: no ACL rule names it for this "
                            "model (the admin adds one: POST /v1/acl)")
        oid = self.offer_index.get((model, source))
        if oid is not None:
            self.offers[oid] = fields  # (a re-offer without ``hf`` drops the old one)
            self.touch(f"{OFFER}{oid}")
            self.save()
            return self.offer_json(oid), False
        if who is not None and not who.admin:
            self.quotas.check(who, "offers", sum(1 for o in self.offers.values() if o["source"] == who.ip))
        oid = self._next_id("offer")
        self.offers[oid] = fields
        self.offer_index[(model, source)] = oid
        log.info("offer %d: %s serves %r (%s)", oid, source, model, fields["name"] or "unnamed")
        self.touch(f"{OFFER}{oid}")
        self.save()
        return self.offer_json(oid), True

    def list_offers(self, model: str | None = None, source: str | None = None, name: str | None = None,
                    revision: str | None = None) -> list[dict[str, Any]]:
        """The offers of ``model``, ``source`` and ``name`` (each if given); ``revision``:
        only Hugging Face snapshots at that commit, or whose refs hold that branch or tag
        (``modelcast fetch hf://ORG/NAME@REVISION`` asks with both)."""
        return [self.offer_json(oid) for oid, o in sorted(self.offers.items())
                if (model is None or o["model"] == model) and (source is None or o["source"] == source)
                and (name is None or o["name"] == name) and (revision is None or _at(o, revision))]

    def get_offer(self, oid: int) -> dict[str, Any]:
        if oid not in self.offers:
            raise UnknownOffer(f"no offer {oid}")
        return self.offer_json(oid)

    def delete_offer(self, oid: int, who: Principal | None = ADMIN) -> None:
        """Withdraw an offer (the admin or its source); its group is the server's to delete."""
        offer = self.get_offer(oid)
        check_source(who, offer["source"], "withdraw its offer")
        del self.offers[oid]
        self.offer_index.pop((offer["model"], offer["source"]), None)
        log.info("offer %d withdrawn: %s no longer serves %r", oid, offer["source"], offer["model"])
        self.touch(f"{OFFER}{oid}")
        self.save()

    def offer_json(self, oid: int) -> dict[str, Any]:
        """The offer as REST shows it, with the id of its group (None until created)."""
        o = self.offers[oid]
        g = self.core.find(o["model"], o["source"])
        return {"id": oid, **o, "group": g.gid if g is not None else None}

    def offered(self, model: str, source: str) -> bool:
        return (model, source) in self.offer_index

    def _next_id(self, kind: str) -> int:
        """A new id of ``kind`` (offer, rule, group): never one given before."""
        n = self.next_ids[kind]
        self.next_ids[kind] = n + 1
        return n

    # -- the ACL -------------------------------------------------------------------------
    def list_rules(self) -> list[dict[str, Any]]:
        return [r.to_dict() for _, r in sorted(self.acl.rules.items())]

    def get_rule(self, rid: int) -> dict[str, Any]:
        if rid not in self.acl.rules:
            raise UnknownRule(f"no ACL rule {rid}")
        return self.acl.rules[rid].to_dict()

    def put_rule(self, body: dict[str, Any], who: Principal | None = ADMIN) -> tuple[dict[str, Any], bool]:
        """Add the rule for ``body["model"]`` (a model id, or a prefix ending in ``*``), or
        replace the one for the same pattern (created False). The admin only."""
        check_admin(who, "change the ACL")
        check("AclRule", body)
        try:
            Rule.from_dict({**body, "id": 0})
        except ValueError as exc:
            raise CoreError(f"ACL rule: {exc}") from None
        existing = self.acl.find(body["model"])
        rid = existing.id if existing is not None else self._next_id("rule")
        rule = Rule.from_dict({**body, "id": rid})
        self.acl.rules[rid] = rule
        log.info("ACL rule %d for %r: offer %s, join %s", rid, rule.model,
                 rule.to_dict().get("offer", "(unsaid)"), rule.to_dict().get("join", "(unsaid)"))
        self.touch(f"{RULE}{rid}")
        self.save()
        return rule.to_dict(), existing is None

    def delete_rule(self, rid: int, who: Principal | None = ADMIN) -> None:
        check_admin(who, "change the ACL")
        self.get_rule(rid)
        del self.acl.rules[rid]
        log.info("ACL rule %d removed", rid)
        self.touch(f"{RULE}{rid}")
        self.save()
