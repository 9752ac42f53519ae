"""IGMP snooping decisions: which membership reports join or leave which (S,G) groups.

Pure: takes the IGMP messages ``ryu.lib.packet`` parsed out of a packet-in and the
core's groups, returns what to do. The Ryu app executes the decisions through
``Service.join``/``leave`` (so an IGMP join is exactly a REST join) and logs them.

Mapping (RFC 3376 record types; a group is ours when its address is G and, for a
source-specific record, its source is S):

* IGMPv3 ``MODE_IS_INCLUDE``/``CHANGE_TO_INCLUDE``/``ALLOW_NEW_SOURCES`` with sources:
  join (S,G) for each listed S.
* ``BLOCK_OLD_SOURCES``: leave (S,G) for each listed S (every group on G when none is
  listed); ``INCLUDE {}`` (IS_IN or TO_IN without sources): leave every group on G.
* ``MODE_IS_EXCLUDE``/``CHANGE_TO_EXCLUDE`` with no sources (any-source membership):
  join every group on G. Other records say nothing we act on.
* IGMPv1/v2 report: join every group on G; IGMPv2 leave: leave every group on G.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ryu.lib.packet import igmp

from controller.core import Group

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
