"""IGMP snooping decisions: which membership reports join or leave which (S,G) groups.

Pure: takes the IGMP messages ``ryu.lib.packet`` parsed out of a packet-in and the
core's groups, returns what to do. ``controller.membership`` carries the decisions out
through ``Service.join``/``leave`` (so an IGMP join is exactly a REST join) and logs them.

Mapping (RFC 3376 record types; a group is ours when its address is G and, for a
source-specific record, its source is S):

* IGMPv3 ``MODE_IS_INCLUDE``/``CHANGE_TO_INCLUDE``/``ALLOW_NEW_SOURCES`` with sources:
  join (S,G) for each listed S.
* ``BLOCK_OLD_SOURCES``: leave (S,G) for each listed S (every group on G when none is
  listed); ``INCLUDE {}`` (IS_IN or TO_IN without sources): leave every group on G.
* ``MODE_IS_EXCLUDE``/``CHANGE_TO_EXCLUDE`` with no sources (any-source membership):
  join every group on G. Other records say nothing we act on.
* IGMPv1/v2 report: join every group on G; IGMPv2 leave: leave every group on G.

Who may join by IGMP (``IgmpPolicy``, docs/rest.md): hosts in ``--igmp-allow``
(CIDRs, ``any`` or ``none``); without that option, the hosts holding a host token when
``--host-tokens`` is given, else any host. In every case a report counts only from the
port and MAC the reporter was learned at (the rule that stops a frame from moving a host).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ryu.lib.packet import igmp

from controller.core import Group
from controller.topoview import HostLoc

Networks = tuple[ipaddress.IPv4Network, ...]
ANY: Networks = (ipaddress.IPv4Network("0.0.0.0/0"),)


def parse_allow(text: str) -> Networks:
    """``--igmp-allow``: ``any``, ``none`` or CIDRs separated by commas; ValueError names
    the bad item."""
    word = text.strip().lower()
    if word == "any":
        return ANY
    if word == "none":
        return ()
    out = []
    for item in text.split(","):
        try:
            out.append(ipaddress.IPv4Network(item.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{item.strip()!r} is not an IPv4 CIDR (e.g. 10.0.0.0/24), any or none") from None
    return tuple(out)


@dataclass(frozen=True)
class IgmpPolicy:
    """The hosts whose membership reports join and leave groups: in ``networks`` or named
    in ``hosts``, reporting from the place they were learned at."""

    networks: Networks = ANY
    hosts: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, allow: Networks | None, host_tokens: Iterable[str] = ()) -> "IgmpPolicy":
        """``allow`` None: the default (the host-token holders if any, else any host)."""
        if allow is not None:
            return cls(allow)
        hosts = frozenset(host_tokens)
        return cls((), hosts) if hosts else cls(ANY)

    def allows(self, ip: str) -> bool:
        if ip in self.hosts:
            return True
        try:
            addr = ipaddress.IPv4Address(ip)
        except ValueError:
            return False
        return any(addr in net for net in self.networks)

    def refuses(self, reporter: str, known: HostLoc | None, place: tuple[int, int, str]) -> str | None:
        """Why a report from ``reporter`` at ``place`` (dpid, port, MAC) is ignored, or None."""
        if not self.allows(reporter):
            return "the host is not allowed to join by IGMP (--igmp-allow)"
        dpid, port, mac = place
        if known is None or (known.dpid, known.port, known.mac) != (dpid, port, mac.lower()):
            return "not from the port and MAC the host was learned at"
        return None

V3_JOIN = frozenset({igmp.MODE_IS_INCLUDE, igmp.CHANGE_TO_INCLUDE_MODE, igmp.ALLOW_NEW_SOURCES})
V3_EMPTY_INCLUDE = frozenset({igmp.MODE_IS_INCLUDE, igmp.CHANGE_TO_INCLUDE_MODE})
V3_EXCLUDE = frozenset({igmp.MODE_IS_EXCLUDE, igmp.CHANGE_TO_EXCLUDE_MODE})


@dataclass(frozen=True)
class Statement:
    """One thing a host said: join or leave G from S (``source`` None: from any source)."""

    address: str
    source: str | None
    join: bool


@dataclass(frozen=True)
class Decision:
    """What to do about one statement for one group; ``group`` None means no group of
    ours has that (S,G), which is only logged."""

    statement: Statement
    group: Group | None = None

    @property
    def join(self) -> bool:
        return self.statement.join


def statements(protocols: Iterable[Any]) -> list[Statement]:
    """The membership statements in a packet's parsed protocols, in report order."""
    out: list[Statement] = []
    for proto in protocols:
        if isinstance(proto, igmp.igmpv3_report):  # before igmp.igmp: it is a subclass
            for rec in proto.records or ():
                out.extend(_record(rec.type_, rec.address, list(rec.srcs or ())))
        elif isinstance(proto, igmp.igmp):
            if proto.msgtype in (igmp.IGMP_TYPE_REPORT_V1, igmp.IGMP_TYPE_REPORT_V2):
                out.append(Statement(proto.address, None, True))
            elif proto.msgtype == igmp.IGMP_TYPE_LEAVE:
                out.append(Statement(proto.address, None, False))
    return out


def _record(rtype: int, address: str, srcs: list[str]) -> list[Statement]:
    if rtype in V3_JOIN and srcs:
        return [Statement(address, s, True) for s in srcs]
    if rtype == igmp.BLOCK_OLD_SOURCES or (rtype in V3_EMPTY_INCLUDE and not srcs):
        return [Statement(address, s, False) for s in srcs or [None]]
    if rtype in V3_EXCLUDE and not srcs:
        return [Statement(address, None, True)]
    return []


def decide(host: str, said: Iterable[Statement], groups: Mapping[int, Group]) -> list[Decision]:
    """The joins and leaves ``host``'s statements call for, in order. Statements already
    true (a receiver joining again) and ones about groups the host itself sources are
    skipped; a later statement sees the effect of an earlier one in the same report."""
    member: dict[int, bool] = {}  # gid -> membership after the decisions so far
    out: list[Decision] = []
    for st in said:
        matches = [g for g in groups.values()
                   if g.address == st.address and (st.source is None or g.source == st.source)]
        if not matches:
            out.append(Decision(st))
        for g in matches:
            if member.get(g.gid, host in g.receivers) == st.join or host == g.source:
                continue
            member[g.gid] = st.join
            out.append(Decision(st, g))
    return out
