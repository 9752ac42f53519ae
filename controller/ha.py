"""High availability: this instance's part in a cluster of controllers sharing an etcd
store (``--store``). ``controller.election`` decides who leads; this module acts on it.

It owns: becoming leader (the predecessor's last state from the store, the store's writes
fenced by the new generation, MASTER asked of every switch and every switch's tables read
before anything changes: REST mutations get a 503 meanwhile), stepping down, a follower's
mirror of the leader's state, where a REST mutation is served (here, or forwarded to a
leader whose record is signed with the cluster secret, with this instance's credential
instead of the caller's token: ``controller.cluster``), ``/health``'s cluster fields, the OpenFlow role each switch is asked for, and a
clean stop's resignation (``request_stop``).

It must not touch: sockets, green threads or Ryu (the app calls ``step`` with the
election's status and ``now`` and sends the messages returned), the core's groups (only
through ``Service.reload``/``mirror``), or the per-core helpers (``rebind`` is the app's).
A single instance (no ``--store``) has an ``Ha`` too: it always leads.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from controller import ofmsgs, settings
from controller.cluster import Cluster, from_settings
from controller.election import LEADER, MASTER, Election, Status, role_for
from controller.rest import FORWARDED, PRINCIPAL_KEY, ApiError, forward_to
from controller.service import Service, StateFileError
from controller.store import EtcdStore

log = logging.getLogger("modelcast.ha")

# the instances in an election (a SIGTERM makes them resign: ``request_stop``)
_CAMPAIGNING: list["Ha"] = []


def request_stop() -> bool:
    """SIGTERM (``controller.main``): an instance in an election resigns first, so the
    others take over at once instead of after the lease TTL. False: none is running
    one (the caller exits as before)."""
    for ha in _CAMPAIGNING:
        ha.stopping = True
    return bool(_CAMPAIGNING)


def instance_id() -> str:
    """Unique per process, readable in the others' logs: host, pid, a random tag."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass
class Step:
    """What the app does after an election step: send ``msgs`` (role requests), and as a
    new leader read ``takeover``'s switches anew (their features, capabilities, tables)."""

    msgs: list[tuple[int, ofmsgs.Msg]] = field(default_factory=list)
    takeover: list[int] = field(default_factory=list)


class Ha:
    """One instance's state in the cluster. ``leading``: it may write to switches and the
    store. ``rebind`` is called whenever the service's core was rebuilt (a new leader's
    reload, a follower's mirror)."""

    def __init__(self, service: Service, store: EtcdStore | None, election: Election | None,
                 rebind: Callable[[], None], takeover_s: float = 5.0,
                 forward_timeout_s: float = 20.0, clock: Callable[[], float] = time.monotonic,
                 cluster: Cluster | None = None) -> None:
        """``cluster``: the shared secret (default: ``--cluster-secret-file`` and
        ``--peers`` of ``controller.settings.current``); several instances need one."""
        self.service, self.store, self.election = service, store, election
        self.secret = cluster if cluster is not None else from_settings(settings.current)
        if election is not None:
            if self.secret is None:
                raise ValueError("several instances (--store) need the secret they share "
                                 "(--cluster-secret-file)")
            if election.signer is None:
                election.signer = self.secret
        service.cluster = self.secret  # (session keys sealed in the store; forwarded requests checked)
        self.rebind = rebind
        self.takeover_s = takeover_s  # mutations wait at most this long for the switches' reads
        self.forward_timeout_s = forward_timeout_s
        self.clock = clock  # (what a mirror cost: the next waits ten times that)
        self.leading = election is None
        self.stopping = False
        self.role: tuple[str, int] | None = None  # the role request switches last got
        self.mirrored = -1  # the store revision a follower's view reflects
        self.next_mirror = float("-inf")
        self.taking_over: set[int] = set()  # a new leader's switches whose tables are being read
        self.takeover_deadline = float("-inf")
        self.slave_refusals = 0
        if election is not None:
            assert store is not None
            service.cluster_health = self.cluster
            _CAMPAIGNING.append(self)

    def restore(self) -> None:
        """A single instance starts from its state file, before any switch connects (one
        of several starts empty: the leader it becomes or follows brings the state). Exits
        (code 2) when the file cannot be read: starting empty would overwrite it, and the
        groups' keys, on the next save."""
        assert self.election is None
        try:
            problems = self.service.load()
        except StateFileError as exc:
            log.critical("%s", exc)
            raise SystemExit(2) from None
        for problem in problems:
            log.error("state file %s: %s", self.service.state_path, problem)

    # -- the election's outcome ----------------------------------------------------------
    def step(self, status: Status, now: float, dpids: Iterable[int]) -> Step:
        """Act on ``status`` (``Election.step``): promote, demote, re-ask the switches'
        roles when they change, and follow the leader while not leading."""
        dpids = list(dpids)
        out = Step()
        if status.role == LEADER and not self.leading:
            out = self._promote(status, now, dpids)
        elif status.role != LEADER and self.leading:
            self._demote(status)
        role = role_for(status) if (status.role != LEADER or self.leading) else None
        if role is not None and role != self.role:
            self.role = role
            out.msgs += self.role_requests(dpids)
        if not self.leading:
            self.follow(now)
        return out

    def _promote(self, status: Status, now: float, dpids: list[int]) -> Step:
        """Won the election: start from the predecessor's last state in the store, ask
        every switch for MASTER, then read each switch's tables and fix only what differs
        (the restart path: a healthy switch gets no flow-mod at all)."""
        assert self.store is not None
        try:
            problems = self.service.reload_store()
        except (OSError, ValueError, StateFileError) as exc:
            log.error("elected, but the state in %s cannot be read (%s): not taking over yet",
                      self.store.name, exc)
            return Step()
        for p in problems:
            log.error("store %s: %s", self.store.name, p)
        self.rebind()
        self.store.fence = status.generation
        self.leading = True
        log.warning("elected leader (generation %d): %d groups, %d switches connected; "
                    "reading their tables", status.generation, len(self.service.core.groups), len(dpids))
        self.role = (MASTER, status.generation)
        self.taking_over = set(dpids)
        self.takeover_deadline = now + self.takeover_s
        return Step(self.role_requests(dpids), list(dpids))

    def _demote(self, status: Status) -> None:
        """Lost the lead (or cannot renew it): stop writing at once; switches keep
        forwarding exactly as they do."""
        assert self.store is not None
        self.store.fence = None
        self.leading = False
        self.mirrored = -1
        log.warning("no longer the leader (%s): following", status.role)

    def follow(self, now: float) -> None:
        """A follower mirrors the leader's state whenever the store's revision moves, at
        most every 0.5 s and taking at most a tenth of the time (a mirror rebuilds every
        tree: with thousands of groups that costs a follower seconds)."""
        assert self.store is not None
        if now < self.next_mirror:
            return
        try:
            rev = self.store.revision()
            if rev == self.mirrored:
                return
            objects = self.store.load()
        except OSError as exc:
            log.debug("store: %s", exc)
            return
        if objects:
            t0 = self.clock()
            try:
                problems = self.service.mirror(objects)
            except (ValueError, StateFileError) as exc:
                log.error("store %s: cannot mirror the leader's state: %s", self.store.name, exc)
                return
            for p in problems:
                log.warning("store %s: %s", self.store.name, p)
            self.rebind()
            self.service.changes.notify()  # (held GETs look at the leader's state)
            self.next_mirror = now + max(0.5, 10 * (self.clock() - t0))
        self.mirrored = rev

    def stop(self) -> None:
        """A clean stop: give up the lead at once (the caller then exits)."""
        assert self.election is not None
        log.warning("stopping: resigning from the election (leader: %s)", self.leading)
        self.leading = False
        self.election.resign()

    # -- switches ------------------------------------------------------------------------
    def role_requests(self, dpids: Iterable[int]) -> list[tuple[int, ofmsgs.Msg]]:
        """The current role request for each of ``dpids`` (none while no role is known)."""
        if self.role is None:
            return []
        return [(d, ofmsgs.role_request(d, self.role[0] == MASTER, self.role[1])) for d in dpids]

    def read(self, dpid: int) -> None:
        """A switch's tables were read and reconciled (a takeover waits for all of them)."""
        if dpid in self.taking_over:
            self.taking_over.discard(dpid)
            if not self.taking_over:
                log.warning("took over: every connected switch read and reconciled")

    def disconnected(self, dpid: int) -> None:
        self.taking_over.discard(dpid)

    def refused_as_slave(self) -> None:
        """A switch refused a message as from a SLAVE: a follower's LLDP packet-outs
        (``ryu.topology``), by design: counted, logged now and then."""
        self.slave_refusals += 1
        if self.slave_refusals in (1, 10, 100) or self.slave_refusals % 1000 == 0:
            log.info("switches refused %d messages of ours as from a SLAVE (expected on a "
                     "follower)", self.slave_refusals)

    # -- REST ----------------------------------------------------------------------------
    def cluster(self) -> dict[str, Any]:
        """``/health``'s fields: this instance's role, the leader's URL, the generation."""
        assert self.election is not None
        st = self.election.status
        role = "leader" if self.leading else ("follower" if st.leader is not None else "unknown")
        return {"role": role, "leader": st.leader.url if st.leader is not None else None,
                "generation": st.generation}

    def leader_url(self) -> str | None:
        """Where reads that only the leader can answer (its event history) go: the
        elected leader's URL while this instance follows one it may forward to (signed
        with the cluster secret and, with ``--peers``, listed); None while it leads or no
        such leader is known."""
        if self.leading or self.election is None or self.secret is None:
            return None
        leader = self.election.status.leader
        return leader.url if leader is not None and self.secret.allowed(leader.url) else None

    def forward(self, req: Any, now: float) -> Any:
        """A mutation on a follower goes to the leader (its answer passed back as is);
        None when this instance leads and serves it itself. Only to a leader whose record
        is signed with the cluster secret (the election checks it) and, with ``--peers``,
        listed there; with this instance's credential for the caller the REST layer
        authenticated, never the caller's token."""
        if self.leading:
            if self.taking_over and now < self.takeover_deadline:
                # a change now would be planned against switches not read yet
                raise ApiError(503, f"taking over as leader: reading {len(self.taking_over)} "
                               "switches; retry shortly", None, {"Retry-After": "1"})
            return None
        assert self.election is not None and self.secret is not None
        leader = self.election.status.leader
        if req.headers.get(FORWARDED) or leader is None:  # (forwarded once already: never again)
            raise ApiError(503, "no leader elected right now; retry shortly", None, {"Retry-After": "1"})
        if not self.secret.allowed(leader.url):
            log.error("the elected leader's URL %s is not one of --peers: not forwarding to it",
                      leader.url[:200])
            raise ApiError(503, "the elected leader is not one of this instance's --peers; not "
                           "forwarding (retry another instance)", None, {"Retry-After": "1"})
        environ = getattr(req, "environ", {})
        who = environ[PRINCIPAL_KEY] if PRINCIPAL_KEY in environ else \
            self.service.authenticate(req.headers.get("Authorization"), mutating=True)
        secret = self.secret
        return forward_to(req, leader.url, timeout=self.forward_timeout_s,
                          sign=lambda method, path, body: secret.credential(method, path, body, who))
