"""Plans onto switches, in order (``Service``'s ``Installer``): one green thread sends
the queued plans one at a time, phase by phase, each phase confirmed by a barrier on
every switch it touched; OpenFlow errors are charged to the plan whose message they
answer (by xid). Also the state writer, which writes and fsyncs in a native thread.

It owns the queue, the barriers and the xid → plan map. It must not decide what is
sent (plans come from the core through ``Service``) nor which switches are connected
(``dps`` is the app's dict, read as it changes).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from eventlet import tpool
from ryu.lib import hub
from ryu.ofproto import ofproto_v1_3_parser as parser

from controller.core import Plan
from controller.service import Service
from controller.tracing import describe, enabled, trace

log = logging.getLogger("modelcast.installer")

class PlanInstaller:
    """Sends plans to the switches in ``dps`` (dpid -> Ryu datapath); ``run`` is the
    green thread that does it."""

    def __init__(self, dps: dict[int, Any], barrier_timeout_s: float) -> None:
        self.dps = dps
        self.barrier_timeout_s = barrier_timeout_s
        self._waiters: dict[tuple[int, int], Any] = {}  # (dpid, barrier xid) -> hub.Event
        self._xid_errors: dict[tuple[int, int], list[str]] = {}  # (dpid, xid) -> plan's errors
        self._queue: Any = hub.Queue()
        self._save_lock = hub.Semaphore()

    def install(self, plan: Plan, done: Callable[[list[str]], None]) -> None:
        """Queue a plan; ``done(errors)`` once its last phase is confirmed (or failed)."""
        self._queue.put((plan, done))

    def queued(self) -> int:
        return self._queue.qsize()

    def run(self) -> None:
        while True:
            plan, done = self._queue.get()
            errors: list[str] = []
            try:
                for i, phase in enumerate(plan.phases):
                    if phase and plan.waits.get(i):
                        # the plan's own pauses (controller.plan): a barrier confirms a
                        # switch's tables, but Open vSwitch moves its datapath's cached
                        # flows onto them a few ms later (its revalidators); a move's old
                        # version needs its last copies out of the fabric
                        hub.sleep(plan.waits[i])
                    touched = []
                    for dpid, msg in phase:
                        dp = self.dps.get(dpid)
                        if dp is None:
                            errors.append(f"switch {dpid:#x} disconnected before install")
                            continue
                        if enabled():
                            trace("send phase %d s%d %s", i, dpid, describe(msg))
                        dp.send_msg(msg)
                        self._xid_errors[(dpid, msg.xid)] = errors
                        if dpid not in touched:
                            touched.append(dpid)
                    self._barrier(touched, errors)
            except Exception as exc:  # never let one plan kill the install loop
                log.exception("install failed")
                errors.append(f"install failed: {exc}")
            finally:
                self._xid_errors = {k: v for k, v in self._xid_errors.items() if v is not errors}
            done(errors)

    def _barrier(self, dpids: list[int], errors: list[str]) -> None:
        waits = []
        for dpid in dpids:
            dp = self.dps.get(dpid)
            if dp is None:
                continue
            msg = parser.OFPBarrierRequest(dp)
            ev = hub.Event()
            dp.set_xid(msg)
            self._waiters[(dpid, msg.xid)] = ev
            dp.send_msg(msg)
            waits.append((dpid, msg.xid, ev))
        deadline = time.monotonic() + self.barrier_timeout_s
        for dpid, xid, ev in waits:
            if not ev.wait(timeout=max(0.0, deadline - time.monotonic())):
                errors.append(f"switch {dpid:#x} did not confirm (barrier timeout)")
            elif enabled():
                trace("barrier s%d confirmed", dpid)
            self._waiters.pop((dpid, xid), None)

    def confirmed(self, dpid: int, xid: int) -> None:
        """A barrier reply."""
        waiter = self._waiters.get((dpid, xid))
        if waiter is not None:
            waiter.set()

    def errors_of(self, dpid: int, xid: int) -> list[str] | None:
        """The error list of the plan in flight that sent message ``xid`` to ``dpid``
        (None: no plan's)."""
        return self._xid_errors.get((dpid, xid))

    def write_state(self, path: Path, payload: bytes) -> None:
        """Write and fsync in a native thread: the hub keeps serving OpenFlow and REST
        meanwhile. Writes run one at a time in the order they were encoded (the lock is
        taken before this green thread first yields), so an older state never replaces
        a newer one."""
        with self._save_lock:
            tpool.execute(Service._write, path, payload)
