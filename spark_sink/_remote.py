"""Writes to a daemon's log (path streamlog://HOST:PORT): executors append, the driver
commits.

Strategy: the daemon is the log's one writing process, so executors need no staging
files: each task appends its rows of each log partition under a fresh transaction
(`append_task`) and returns {partition: (txn id, rows)} in its commit message. Nothing
is visible to read_committed readers until the driver commits. The driver's
`commit_streaming` then decides, per partition, from `last_commit(stream, p, tag)`:

    marker  "<batch id> <end offset> <txn id>,<txn id>,..."   (ids in hex, sorted)

Every commit of a micro-batch in a partition carries the same marker, naming all the
batch's transactions there. A partition whose last marker names a later batch, or this
batch with all its transactions committed, already has the batch: the new transactions
are aborted. A marker of this batch with some transactions still open is a commit that
died part way: those transactions (rows of the first attempt, which the daemon still
holds) are committed, and the new ones aborted. Otherwise the new transactions are
committed, in id order. So a micro-batch is visible exactly once however the commit
or its replay is cut short. The end offset in the marker is the partition's end when
the commit began, for a reader's information only (others may append to a daemon's
log concurrently, so nothing here relies on it).

Transactional producers (DESIGN 6): a streaming task appends to log partition p as the
producer `"<tag>/<p>/<task's Spark partition id>"`, a transactional id stable across the
query's restarts and the task's retries. Starting it (Log.init_producer) aborts at
once what an earlier attempt of the same task left open (a failed task, a killed
driver), and fences that attempt: its later appends and commits are refused. So a crash
never hides committed data from read_committed readers beyond the restart. A commit
that died part way may have had some of its listed transactions aborted so by the
replay's tasks: the replay then commits the new transactions of exactly those tasks
(their rows are the same: see _commit.py on replays) and aborts the others.

Only the transactional mode exists here: truncate mode would cut a log that other
clients of the daemon may be appending to.

Limit: a batch df.write (no stable id) that dies leaves its transactions open in the
daemon until its --txn-timeout-s or its restart (recovery aborts them).
"""

from __future__ import annotations

import logging

from streamlog import InvalidArgument, StreamLogError, TxnState

from ._commit import CHUNK_ROWS, chunks, python_columns
from ._staging import split_by_partition

log = logging.getLogger("streamlog.spark")


def open_remote_writable(options):
    """A client of the daemon at options.path (token from STREAMLOG_TOKEN)."""
    import streamlog
    return streamlog.open_log(options.path)


def ensure_stream_remote(options) -> int:
    """Create the stream in the daemon's log when missing; return its partition count.

    Raises:
        InvalidArgument when the stream exists with another partition count than the
        `partitions` option says.
    """
    with open_remote_writable(options) as target:
        if options.stream in target.streams():
            count = target.partition_count(options.stream)
        else:
            count = target.create_stream(options.stream, options.partitions or 1)
    if options.partitions is not None and options.partitions != count:
        raise InvalidArgument(f"stream {options.stream!r} has {count} partitions, not "
                              f"{options.partitions} (option 'partitions')")
    return count


def producer_id(tag: str, number: int, task: int) -> str:
    """The transactional id of a streaming task writing log partition `number`."""
    return f"{tag}/{number}/{task}"


def append_task(options, columns, iterator, *, tag: str | None = None,
                task: int | None = None) -> dict[int, list]:
    """Append one task's rows, each partition's under its own transaction, left open.
    With `tag` and `task` (a streaming task: its query and Spark partition id) each
    transaction is begun by the task's producer for that partition (module docstring).
    Returns {partition: [txn id, rows, task or None]}. On an error the task's
    transactions are aborted before it propagates."""
    txns: dict[int, list] = {}
    with open_remote_writable(options) as target:
        try:
            for batch in iterator:
                staged = columns.stage(batch)
                if staged.num_rows == 0:
                    continue
                for number, run in split_by_partition(staged):
                    if number not in txns:
                        txns[number] = _begin(target, options.stream, number, tag, task)
                    for chunk in chunks([run], CHUNK_ROWS):
                        values, keys, timestamps, headers = python_columns(chunk)
                        target.append_batch_sync(options.stream, values, keys=keys,
                                                 timestamps_us=timestamps, partition=number,
                                                 headers=headers, txn_id=txns[number][0])
                    txns[number][1] += run.num_rows
        except BaseException:
            _abort_all(target, options.stream, txns_of([txns]))
            raise
    return txns


def _begin(target, stream: str, number: int, tag: str | None, task: int | None) -> list:
    if tag is None or task is None:
        return [target.new_txn_id(), 0, None]
    producer = producer_id(tag, number, task)
    epoch = target.init_producer(stream, number, producer)
    return [target.begin_txn(stream, number, producer, epoch), 0, task]


def txns_of(task_txns) -> dict[int, list[int]]:
    """{partition: sorted txn ids} over tasks' {partition: [txn id, rows, ...]} maps."""
    out: dict[int, set[int]] = {}
    for txns in task_txns:
        for number, entry in (txns or {}).items():
            out.setdefault(int(number), set()).add(int(entry[0]))
    return {number: sorted(ids) for number, ids in out.items()}


def tasks_of(task_txns) -> dict[tuple[int, int], int]:
    """{(partition, txn id): task} of the transactions tasks' producers began."""
    return {(int(number), int(entry[0])): int(entry[2])
            for txns in task_txns for number, entry in (txns or {}).items()
            if len(entry) > 2 and entry[2] is not None}


def encode_marker(batch_id: int, end: int, txn_ids, tasks=None) -> bytes:
    """`<batch> <end> <txn>[@<task>],...` (hex ids; the task whose producer began it)."""
    tasks = tasks or {}
    listed = ",".join(f"{t:x}" + (f"@{tasks[t]}" if t in tasks else "") for t in txn_ids)
    return f"{batch_id} {end} {listed}".encode("ascii")


def parse_marker(marker: bytes | None) -> tuple[int, list[int], dict[int, int]] | None:
    """(batch id, txn ids, {txn id: task}) from a marker, or None. A marker of two
    fields (batch and offset, as the local sink writes) names no transactions."""
    if marker is None:
        return None
    try:
        fields = marker.decode("ascii").split()
        if len(fields) == 2:
            return int(fields[0]), [], {}
        batch, _end, listed = fields
        txns, tasks = [], {}
        for item in filter(None, listed.split(",")):
            txn, _, task = item.partition("@")
            txns.append(int(txn, 16))
            if task:
                tasks[txns[-1]] = int(task)
        return int(batch), txns, tasks
    except ValueError:
        raise StreamLogError(f"a commit marker of this query is not ours: {marker!r}; "
                             f"another writer uses the same transactionalId") from None


def commit_streaming(options, task_txns, batch_id: int, tag: str) -> dict:
    """Make a micro-batch's transactions visible exactly once (see the module
    docstring). Returns {partition: outcome}: "committed", "completed" (a cut-short
    commit of this batch finished), or "skipped" (already committed)."""
    assert batch_id >= 0
    ours, tasks = txns_of(task_txns), tasks_of(task_txns)
    outcomes = {}
    with open_remote_writable(options) as target:
        stream = options.stream
        for number in sorted(ours):
            mine = ours[number]
            last = parse_marker(target.last_commit(stream, number, tag))
            if last is not None and last[0] > batch_id:
                _abort_all(target, stream, {number: mine})
                outcomes[number] = "skipped"
                continue
            if last is not None and last[0] == batch_id:
                outcomes[number] = _complete(target, stream, number, batch_id, tag, mine,
                                             last, tasks)
                continue
            marker = encode_marker(batch_id, target.end_offset(stream, number), mine,
                                   {t: tasks[(number, t)] for t in mine if (number, t) in tasks})
            for txn_id in mine:
                target.commit_txn(stream, number, txn_id, tag=tag, marker=marker)
            outcomes[number] = "committed"
    return outcomes


def _complete(target, stream: str, number: int, batch_id: int, tag: str, mine: list[int],
              last, tasks: dict) -> str:
    """A marker of this very batch exists in the partition: an earlier commit of it
    died part way (or finished, and Spark replays it). Commit what it left open; where
    the replay's tasks fenced and aborted a listed transaction, commit the replay's
    transaction of the same task instead (the marker names each one's task); abort the
    rest of the replay's."""
    _, listed, listed_tasks = last
    states = {t: target.txn_state(stream, number, t) for t in listed}
    pending = [t for t in listed if states[t] == TxnState.OPEN]
    lost = [t for t in listed if states[t] not in (TxnState.OPEN, TxnState.COMMITTED)]
    by_task = {tasks[(number, t)]: t for t in mine if (number, t) in tasks}
    replacements = []
    for txn_id in lost:
        task = listed_tasks.get(txn_id)
        if task not in by_task:
            raise StreamLogError(
                f"streamlog sink: micro-batch {batch_id} of {tag} in {stream}/{number} was "
                f"committed in part, and transaction {txn_id:x} of it can no longer be "
                f"committed nor replaced by the replay's; the batch cannot be completed "
                f"exactly once")
        replacements.append(by_task[task])
    marker = target.last_commit(stream, number, tag)
    for txn_id in pending:
        target.commit_txn(stream, number, txn_id, tag=tag, marker=marker)
    if replacements:  # the marker now names them in place of the lost ones
        now = [t for t in listed if t not in lost] + replacements
        named = {t: listed_tasks[t] for t in listed if t in listed_tasks and t not in lost}
        named.update({t: tasks[(number, t)] for t in replacements})
        marker = encode_marker(batch_id, target.end_offset(stream, number), sorted(now), named)
        for txn_id in sorted(replacements):
            target.commit_txn(stream, number, txn_id, tag=tag, marker=marker)
    _abort_all(target, stream, {number: [t for t in mine if t not in replacements]})
    return "completed" if pending or replacements else "skipped"


def commit_once(options, task_txns, tag: str, note: str) -> None:
    """A batch df.write: commit every task's transactions (each partition's in id
    order, all under one marker naming them)."""
    with open_remote_writable(options) as target:
        for number, mine in sorted(txns_of(task_txns).items()):
            marker = f"{note} {target.end_offset(options.stream, number)} ".encode() + (
                ",".join(f"{t:x}" for t in mine).encode())
            for txn_id in mine:
                target.commit_txn(options.stream, number, txn_id, tag=tag, marker=marker)


def abort(options, task_txns) -> None:
    """Abort the transactions of tasks whose job failed (best effort: an error is logged,
    and the daemon's next recovery aborts what is left open)."""
    ours = txns_of(task_txns)
    if not ours:
        return
    try:
        with open_remote_writable(options) as target:
            _abort_all(target, options.stream, ours)
    except Exception:  # noqa: BLE001 - the job's own error matters more
        log.exception("streamlog sink: could not abort the transactions of a failed write")


def _abort_all(target, stream: str, by_partition: dict[int, list[int]]) -> None:
    for number, ids in by_partition.items():
        for txn_id in ids:
            try:
                if target.txn_state(stream, number, txn_id) == TxnState.OPEN:
                    target.abort_txn(stream, number, txn_id)
            except Exception:  # noqa: BLE001 - keep aborting the others
                log.exception("could not abort transaction %#x in %s/%d", txn_id, stream,
                              number)
