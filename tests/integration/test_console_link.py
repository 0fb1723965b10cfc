"""The console worker's link to its daemon (console/daemon.py): LinkedDaemon's calls
answered by serve_link from a LocalDaemon over a real socket pair, refusals carried with
their status, bytes carried whole, a malformed call answered, a daemon that is gone."""

import asyncio
import json
import socket

import pytest

from streamlog.console.daemon import LinkedDaemon, LocalDaemon, Refused, serve_link


@pytest.fixture
def log(open_logs, log_dir):
    log = open_logs(log_dir, fsync="never")
    log.create_stream("s", 2)
    return log


async def linked(log):
    ours, theirs = socket.socketpair()
    daemon = LocalDaemon(log, lambda fn, *args: asyncio.to_thread(fn, *args))
    reader, writer = await asyncio.open_connection(sock=theirs)
    served = asyncio.create_task(serve_link(daemon, reader, writer))
    reader, writer = await asyncio.open_connection(sock=ours)
    return LinkedDaemon(reader, writer), writer, served


async def test_the_calls_cross_the_link_with_their_bytes_whole(log):
    daemon, writer, served = await linked(log)
    try:
        value = bytes(range(256))
        at = await daemon.produce("s", value, b"\xff\x00key", 1,
                                  [("h", b"\x80\x81"), ("none", None)], 1_000_000)
        (record,) = list(log.reader("s", 1))
        assert at == [1, record.offset] == [1, 0]
        assert (record.value, record.key, record.timestamp_us) == (value, b"\xff\x00key",
                                                                   1_000_000)
        assert record.headers == (("h", b"\x80\x81"), ("none", None))
        assert await daemon.groups() is None  # no Kafka listener
        assert await daemon.appends_per_second() is None  # no metrics
        assert await daemon.apply_retention() == []
        with pytest.raises(Refused) as refused:
            await daemon.produce("nope", b"x", None, None, [], None)
        assert (refused.value.status, refused.value.text) == (400, "no stream 'nope'")
        with pytest.raises(Refused) as refused:
            await daemon.reset_group("g", "", "earliest", None)
        assert refused.value.status == 409 and "--kafka-port" in refused.value.text
        with pytest.raises(Refused) as refused:
            await daemon.produce("s", b"x", None, 7, [], None)  # no partition 7
        assert refused.value.status == 400
    finally:
        writer.close()
        await served


async def test_a_malformed_or_unknown_call_is_answered_and_the_link_goes_on(log):
    daemon, writer, served = await linked(log)
    try:
        reader = daemon._reader
        for line, expected in ((b"not json\n", "a malformed call"),
                               (b'{"id": 7, "op": "close"}\n', "no call 'close'"),
                               (b'{"id": 8, "op": "produce", "args": {}}\n',
                                "a malformed call")):
            writer.write(line)
            answer = json.loads(await reader.readline())
            assert answer["error"][0] == 400 and expected in answer["error"][1]
        assert await daemon.appends_per_second() is None  # still answering
    finally:
        writer.close()
        await served


async def test_a_daemon_that_is_gone_is_503(log):
    daemon, writer, served = await linked(log)
    served.cancel()
    await asyncio.gather(served, return_exceptions=True)
    with pytest.raises(Refused) as refused:
        await daemon.groups()
    assert refused.value.status == 503
    writer.close()
