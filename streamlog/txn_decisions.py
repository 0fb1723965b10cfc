"""Transactions of several partitions committed as one (Log.commit_txns, DESIGN 6).

Strategy: a transaction is one partition's; a writer whose transaction spans partitions
(the Kafka listener's transactional producers, a job writing several outputs) opens one
in each and asks the log to commit them together. The log first appends a decision to
its internal stream `__transaction_state` (one partition): the list of (stream,
partition, transaction id) and the commit's tag and marker, durable before any commit
marker is written. Then it writes each commit marker, then a record saying the decision
is complete. A crash before the decision is durable leaves the transactions open, and
the next writable open aborts them as it aborts every transaction a crashed writer
left open; a crash after it leaves a decision without its completion, and the next
writable open commits, instead of aborting, the transactions it names that are still
open (their partitions are opened after `__transaction_state` and are told which), then
records the completion. So the transactions are all committed or all aborted, whatever
the moment of the crash.

Records of `__transaction_state`: key b"commit:" + the decision's id in hex, value the
decision as JSON {"parts": [[stream, partition, txn_id], ...], "tag", "marker" (hex)};
the same key with an empty value completes it. The stream only grows; a writable open
reads it whole (two small records per commit of several partitions).
"""

from __future__ import annotations

import json

from .errors import InvalidArgument
from .txn import TxnState, encode_commit, new_txn_id

DECISIONS_STREAM = "__transaction_state"
_PREFIX = b"commit:"

Part = tuple[str, int, int]  # (stream, partition, transaction id)


def encode(parts: list[Part], tag: str, marker: bytes) -> bytes:
    return json.dumps({"parts": [list(p) for p in parts], "tag": tag,
                       "marker": bytes(marker).hex()}).encode()


def decode(value: bytes) -> tuple[list[Part], str, bytes]:
    found = json.loads(value)
    parts = [(str(s), int(p), int(t)) for s, p, t in found["parts"]]
    return parts, str(found["tag"]), bytes.fromhex(found["marker"])


def pending(log) -> dict[bytes, tuple[list[Part], str, bytes]]:
    """The decisions in `log`'s `__transaction_state` without their completion."""
    out: dict[bytes, tuple[list[Part], str, bytes]] = {}
    if DECISIONS_STREAM not in log.streams():
        return out
    with log.reader(DECISIONS_STREAM, 0, read_committed=False) as reader:
        for record in reader.records():
            key = record.key or b""
            if not key.startswith(_PREFIX):
                continue
            if record.value:
                try:
                    out[key] = decode(record.value)
                except (ValueError, KeyError, TypeError):
                    continue  # not a decision of ours: nothing to complete
            else:
                out.pop(key, None)
    return out


def by_partition(decisions) -> dict[tuple[str, int], dict[int, bytes]]:
    """{(stream, partition): {txn_id: its COMMIT record's value}} of `decisions`."""
    out: dict[tuple[str, int], dict[int, bytes]] = {}
    for parts, tag, marker in decisions.values():
        for stream, number, txn_id in parts:
            out.setdefault((stream, number), {})[txn_id] = encode_commit(tag, marker)
    return out


def complete(log, keys) -> None:
    """Record that the decisions `keys` are complete."""
    keys = list(keys)
    if keys:
        log.append_internal_sync(DECISIONS_STREAM, [b""] * len(keys), keys=keys)


def commit(log, parts: list[Part], tag: str, marker: bytes) -> list[int | None]:
    """Commit the open transactions `parts` as one (see the module docstring). A part
    already committed (a retry) is left as it is: its entry is None. Returns each
    part's COMMIT marker offset."""
    parts = [tuple(p) for p in parts]
    if len(set(parts)) != len(parts) or len({(s, p) for s, p, _t in parts}) != len(parts):
        raise InvalidArgument("commit_txns: each partition at most once")
    states = [log.txn_state(stream, number, txn_id) for stream, number, txn_id in parts]
    for (stream, number, txn_id), state in zip(parts, states):
        if state is None or state is TxnState.ABORTED:
            what = "has no data" if state is None else "was aborted"
            raise InvalidArgument(f"transaction {txn_id:#x} {what} in {stream}/{number}")
    todo = [part for part, state in zip(parts, states) if state is TxnState.OPEN]
    key = None
    if len(todo) > 1:  # one partition's commit marker is its own decision
        log.create_internal_stream(DECISIONS_STREAM, 1)
        key = _PREFIX + b"%x" % new_txn_id()
        log.append_internal_sync(DECISIONS_STREAM, [encode(todo, tag, marker)], keys=[key])
    offsets = {part: log.commit_txn(*part, tag=tag, marker=marker) for part in todo}
    if key is not None:
        complete(log, [key])
    return [offsets.get(part) for part in parts]
