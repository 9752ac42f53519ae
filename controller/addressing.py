"""Group naming: a model identifier (name or checkpoint hash) maps deterministically to an
SSM address in 232.0.0.0/8, so every host derives the same address for the same model."""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Callable

from controller.errors import Conflict, InvalidAddress

SSM = ipaddress.IPv4Network("232.0.0.0/8")
# 232.0.0.0/24 is reserved (RFC 4607); usable addresses are 232.0.1.0 .. 232.255.255.255.
_FIRST = int(SSM.network_address) + 256
_COUNT = SSM.num_addresses - 256
MAX_MODEL_LEN = 256


def check_model(model: object) -> str:
    if not isinstance(model, str) or not model.strip():
        raise InvalidAddress("model must be a non-empty string (a name or checkpoint hash)")
    if len(model) > MAX_MODEL_LEN or not model.isprintable():
        raise InvalidAddress(f"model must be printable and at most {MAX_MODEL_LEN} characters")
    return model.strip()


def check_ssm(address: str) -> str:
    try:
        addr = ipaddress.IPv4Address(str(address).strip())
    except ValueError as exc:
        raise InvalidAddress(f"group address {address!r} is not an IPv4 address") from exc
    if addr not in SSM or int(addr) < _FIRST:
        raise InvalidAddress(f"group address {addr} is not in the SSM range 232.0.1.0-232.255.255.255")
    return str(addr)


def ssm_address(model: str, taken: Callable[[str], bool] = lambda a: False) -> str:
    """Hash the model id into 232/8; on a collision with another model's group, probe
    forward. The same model and the same set of existing groups give the same address."""
    model = check_model(model)
    h = int.from_bytes(hashlib.blake2b(model.encode(), digest_size=8).digest(), "big")
    for i in range(_COUNT):
        n = _FIRST + (h + i) % _COUNT
        addr = f"{n >> 24}.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"  # (str(IPv4Address(n)), ~10x faster)
        if not taken(addr):
            return addr
    raise Conflict("every SSM group address is in use")
