"""IGMP membership reports carried out: a report from a host the operator allows
(``IgmpPolicy``: ``--igmp-allow``), sent from the port and MAC it was learned at, joins
or leaves the (S,G) groups ``controller.igmp`` decides on -- through ``Service.join`` and
``leave``, so an IGMP join is exactly a REST join -- and every outcome is logged.

It owns carrying out those decisions and their log lines. It must not parse frames (the
app hands over the protocols Ryu parsed) nor touch switches (a join's plan goes through
``Service``).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from controller import igmp
from controller.errors import CoreError
from controller.igmp import IgmpPolicy
from controller.service import Service

log = logging.getLogger("modelcast.igmp")


def report(policy: IgmpPolicy, service: Service, protocols: Iterable[Any], reporter: str,
           place: tuple[int, int, str]) -> None:
    """One membership report from ``reporter`` at ``place`` (dpid, port, MAC)."""
    refusal = policy.refuses(reporter, service.core.view.hosts.get(reporter), place)
    if refusal:
        log.info("IGMP report from %s ignored: %s", reporter, refusal)
        return
    said = igmp.statements(protocols)
    for d in igmp.decide(reporter, said, service.core.groups):
        st, g, verb = d.statement, d.group, "join" if d.join else "leave"
        if g is None:
            log.info("IGMP %s from %s for (%s, %s): no such group", verb, reporter,
                     st.source or "*", st.address)
            continue
        try:
            service.join(g.gid, reporter) if d.join else service.leave(g.gid, reporter)
            log.info("IGMP %s: %s %s group %d (%s, %s)", verb, reporter,
                     "joined" if d.join else "left", g.gid, g.source, g.address)
        except CoreError as exc:
            log.warning("IGMP from %s for group %d ignored: %s", reporter, g.gid, exc)
