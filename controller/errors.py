"""Errors the pure core raises on bad input: each names what was wrong, so the REST layer
can map it to a status code and a user sees one clear sentence."""


class CoreError(ValueError):
    """Base class: the request cannot be served as asked."""

    status = 400


class InvalidAddress(CoreError):
    """Not an IPv4 address of the kind required (unicast host, SSM group)."""


class UnknownHost(CoreError):
    """The controller has not learned (or was not told) where this host attaches."""

    status = 404


class UnknownGroup(CoreError):
    status = 404


class UnknownReceiver(CoreError):
    """The address is not a receiver of the group."""

    status = 404


class UnknownSwitch(CoreError):
    """No such switch (or no link between two switches) in the controller's view."""

    status = 404


class UnknownOffer(CoreError):
    status = 404


class ReceiverIsSource(CoreError):
    """A host cannot receive its own stream through the fabric."""


class EmptyReceivers(CoreError):
    """A tree needs at least one receiver."""


class Unreachable(CoreError):
    """No live path from the source to some receivers (strict tree computation only)."""

    status = 409

    def __init__(self, message: str, receivers: frozenset[str] = frozenset()) -> None:
        super().__init__(message)
        self.receivers = receivers


class Conflict(CoreError):
    status = 409
