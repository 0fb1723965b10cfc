"""How operator state becomes bytes, for checkpoints and CEC footprints.

Strategy: operators keep state as plain Python values (numbers, strings, bytes, lists,
tuples, dicts); the runtime serialises them with a `StateCodec`, so a user writes no
struct layouts. The default is MessagePack (the `msgpack` library): compact, fast, and
unlike pickle it never runs code while decoding bytes read back from a log or a store.
Tuples come back as tuples (an ext type keeps them apart from lists), so a state that
uses tuples as dict keys round-trips. A user with other needs (dataclasses, NumPy arrays)
passes their own codec: any object with `encode(obj) -> bytes` and `decode(bytes) -> obj`.

A codec is stateless; one instance may serve many threads.
"""

from __future__ import annotations

from typing import Any, Protocol

import msgpack

from ..errors import CorruptionError, InvalidArgument

_TUPLE = 1  # msgpack ext type code for a tuple


class StateCodec(Protocol):
    def encode(self, state: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


def _default(obj):
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, _packb(list(obj)))
    if isinstance(obj, (set, frozenset)):
        raise InvalidArgument("state holds a set: MessagePack has no set type; use a list "
                              "or a dict, or pass your own codec")
    raise InvalidArgument(f"state holds a {type(obj).__name__}, which the default codec "
                          f"cannot serialise; use plain values or pass your own codec")


def _ext_hook(code: int, data: bytes):
    if code == _TUPLE:
        return tuple(_unpackb(data))
    raise CorruptionError(f"state holds an unknown MessagePack extension type {code}")


def _packb(obj) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True, strict_types=True)


def _unpackb(data: bytes):
    return msgpack.unpackb(data, raw=False, ext_hook=_ext_hook, strict_map_key=False,
                           use_list=True)


class MsgpackCodec:
    """The default codec (module docstring)."""

    def encode(self, state: Any) -> bytes:
        return _packb(state)

    def decode(self, data: bytes) -> Any:
        try:
            return _unpackb(data)
        except (ValueError, msgpack.UnpackException, TypeError) as error:
            raise CorruptionError(f"operator state cannot be decoded: {error}") from None


DEFAULT_CODEC = MsgpackCodec()
