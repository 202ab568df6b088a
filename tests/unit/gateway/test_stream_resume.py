"""The resumable-stream registry on its own (no HTTP, no worker): readers, takeover, the TTL, the byte cap, and
a producer that fails. Payloads come from a plain async generator standing in for a request's chunks; aborting
the request is recorded."""

from __future__ import annotations

import asyncio

from gateway.metrics.mili_metrics import Metrics
from gateway.streams.resume_buffer import StreamRegistry


class Source:
    """A request's payloads, released one by one by the test; records whether it was aborted or closed."""

    def __init__(self, payloads: list[str]):
        self.pending: asyncio.Queue = asyncio.Queue()
        for p in payloads:
            self.pending.put_nowait(p)
        self.aborted = False
        self.closed = False

    def push(self, payload: str) -> None:
        self.pending.put_nowait(payload)

    async def payloads(self):
        try:
            while True:
                payload = await self.pending.get()
                yield payload
                if payload == "[DONE]":
                    return
        finally:
            self.closed = True

    def abort(self) -> None:
        self.aborted = True


def registry(ttl_s: float = 60.0, max_bytes: int = 1 << 20) -> StreamRegistry:
    return StreamRegistry(ttl_s, max_bytes, Metrics("m"))


def sample(reg: StreamRegistry, name: str, **labels) -> float:
    return reg.metrics.registry.get_sample_value(name, {"model": "m", **labels}) or 0.0


async def take(reader, count: int) -> list[tuple[int, str]]:
    out = []
    async for event in reader.events():
        out.append(event)
        if len(out) == count:
            break
    return out


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_reader_gets_every_event_with_ids_and_a_resume_replays_after_the_last_id():
    async def main():
        reg = registry()
        src = Source(["a", "b", "c"])
        reader = reg.start(src.payloads(), src.abort, "Bearer k")
        assert await take(reader, 2) == [(0, "a"), (1, "b")]
        reader.detach()  # the client went away after "b"
        src.push("d")
        src.push("[DONE]")
        await settle()
        stream = reg.find(reader.stream.id, "Bearer k")
        assert stream is not None and stream.finished and not src.aborted
        resumed = reg.attach(stream, 2)
        assert [e async for e in resumed.events()] == [(2, "c"), (3, "d"), (4, "[DONE]")]
        assert reg.find(reader.stream.id, "Bearer other") is None
        assert sample(reg, "mili_stream_resume_buffered_bytes") == len("abcd[DONE]")

    run(main())


def test_a_new_reader_ends_the_old_one():
    async def main():
        reg = registry()
        src = Source(["a"])
        old = reg.start(src.payloads(), src.abort, "")
        old_events = asyncio.create_task(take(old, 10))
        await settle()
        new = reg.attach(old.stream, 0)
        assert await old_events == [(0, "a")]  # ended by the takeover, not by [DONE]
        src.push("[DONE]")
        assert [e async for e in new.events()] == [(0, "a"), (1, "[DONE]")]

    run(main())


def test_a_detached_stream_is_aborted_after_the_ttl_unless_resumed():
    async def main():
        reg = registry(ttl_s=0.2)
        src = Source(["a"])
        reader = reg.start(src.payloads(), src.abort, "")
        await take(reader, 1)
        reader.detach()
        await asyncio.sleep(0.1)
        resumed = reg.attach(reader.stream, 1)  # back in time: the timer stops
        await asyncio.sleep(0.3)
        assert not src.aborted
        resumed.detach()
        await asyncio.sleep(0.3)
        assert src.aborted and src.closed and reg.find(reader.stream.id, "") is None
        assert sample(reg, "mili_stream_resume_aborted_total", reason="ttl") == 1
        assert sample(reg, "mili_stream_resume_buffered_bytes") == 0

    run(main())


def test_a_finished_stream_is_forgotten_after_the_ttl():
    async def main():
        reg = registry(ttl_s=0.2)
        src = Source(["a", "[DONE]"])
        reader = reg.start(src.payloads(), src.abort, "")
        assert [e async for e in reader.events()] == [(0, "a"), (1, "[DONE]")]
        assert reg.find(reader.stream.id, "") is not None
        await asyncio.sleep(0.3)
        assert reg.find(reader.stream.id, "") is None and sample(reg, "mili_stream_resume_buffered_bytes") == 0
        assert sample(reg, "mili_stream_resume_aborted_total", reason="ttl") == 0

    run(main())


def test_the_cap_drops_the_stream_idle_longest_first():
    async def main():
        reg = registry(max_bytes=10)
        first, second, third = Source(["aaaa"]), Source(["bbbb"]), Source([])
        readers = [reg.start(s.payloads(), s.abort, "") for s in (first, second, third)]
        await settle()
        readers[0].detach()  # idle longest, still running
        await asyncio.sleep(0.01)
        readers[1].detach()
        third.push("cccc")  # 12 bytes > 10: the first goes
        await settle()
        assert first.aborted and reg.find(readers[0].stream.id, "") is None
        assert not second.aborted and reg.find(readers[1].stream.id, "") is not None
        assert sample(reg, "mili_stream_resume_aborted_total", reason="buffer_full") == 1
        assert sample(reg, "mili_stream_resume_buffered_bytes") == 8
        third.push("ddddddd")  # 15 > 10: the second goes too, and 11 > 10 still
        await settle()
        assert second.aborted and reg.find(readers[2].stream.id, "") is None
        assert not third.aborted  # it has a reader: it only stops being resumable
        assert await take(readers[2], 2) == [(0, "cccc"), (1, "ddddddd")]
        assert readers[2].stream.events == []  # what its reader sent is released
        assert sample(reg, "mili_stream_resume_buffered_bytes") == 0
        assert sample(reg, "mili_stream_resume_evicted_total") == 3
        readers[2].detach()  # no longer resumable: a disconnect aborts at once
        assert third.aborted

    run(main())


def test_a_detached_stream_that_outgrows_the_cap_aborts_itself():
    async def main():
        reg = registry(max_bytes=5)
        src = Source(["abc"])
        reader = reg.start(src.payloads(), src.abort, "")
        await take(reader, 1)
        reader.detach()
        src.push("def")
        await settle()
        assert src.aborted and src.closed and reader.stream.events == ["abc"]
        assert sample(reg, "mili_stream_resume_buffered_bytes") == 0

    run(main())


def test_a_failing_producer_ends_the_stream_with_an_error_event():
    async def main():
        async def broken():
            yield "a"
            raise RuntimeError("boom")

        reg = registry()
        aborted = []
        reader = reg.start(broken(), lambda: aborted.append(True), "")
        events = [e async for e in reader.events()]
        assert events[0] == (0, "a") and events[-1] == (2, "[DONE]")
        assert '"internal server error"' in events[1][1] and aborted

    run(main())


def test_bad_flag_values_are_refused(capsys):
    from gateway.cli import main

    for flags, message in ((["--stream-resume-ttl", "-1"], "--stream-resume-ttl must be 0"),
                           (["--stream-resume-ttl", "inf"], "--stream-resume-ttl must be 0"),
                           (["--stream-resume-buffer", "0"], "--stream-resume-buffer must be above 0")):
        assert main(["serve", *flags]) == 2
        assert message in capsys.readouterr().err
