"""A scripted engine for dashboard tests: GetModelInfo and an evolving GetLoad.

    python -m tests.dashboard.fake_engine --listen unix:///tmp/e.sock --requests 40

Each GetLoad advances a synthetic clock by 0.5 s: counters grow at fixed rates, `requests`
rows are live, and completion records (decode b8 every 50 ms with the first eight requests,
prefill b1 t512 every 0.5 s with the ninth) follow the caller's cursor.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc

from services.common.pb import engine_pb2, engine_pb2_grpc


class FakeEngine(engine_pb2_grpc.EngineServicer):
    def __init__(self, num_requests: int) -> None:
        self.num_requests = num_requests
        self.clock = 100.0
        self.sequence = 0
        self.records: list[engine_pb2.CompletionRecord] = []

    async def GetModelInfo(self, request, context):
        return engine_pb2.ModelInfo(model_id="fake-model", served_names=["fake-demo"])

    def _advance(self) -> None:
        start, self.clock = self.clock, self.clock + 0.5
        t = start
        while t < self.clock - 1e-9:
            t += 0.05
            self.sequence += 1
            self.records.append(engine_pb2.CompletionRecord(
                sequence=self.sequence, time_s=t, kind="decode", label="b8", gpu_ms=4.0,
                requests=[engine_pb2.RequestRef(slot=i, generation=1) for i in range(8)],
                output_tokens=8))
        self.sequence += 1
        self.records.append(engine_pb2.CompletionRecord(
            sequence=self.sequence, time_s=self.clock, kind="prefill", label="b1 t512",
            gpu_ms=12.0, requests=[engine_pb2.RequestRef(slot=8, generation=1)],
            prompt_tokens=512))
        self.records = self.records[-1024:]

    async def GetLoad(self, request, context):
        self._advance()
        elapsed = self.clock - 100.0
        snapshot = engine_pb2.LoadSnapshot(
            session_id="fake", sample_time_s=self.clock, uptime_s=elapsed,
            slots_total=64, slots_live=self.num_requests, slots_free=64 - self.num_requests,
            num_running=self.num_requests, num_waiting=2, pages_total=1024, pages_free=900,
            pages_cached=100, checkpoints_cached=7, requests_completed=int(elapsed * 3),
            prompt_tokens=int(elapsed * 1024), generation_tokens=int(elapsed * 160),
            prefix_reused_tokens=4096, dropped_updates=0)
        snapshot.graphs.add(kind="decode", label="b8", batch_capacity=8, calls=10,
                            mean_gpu_ms=4.0, max_gpu_ms=4.0)
        snapshot.graphs.add(kind="prefill", label="b1 t512", batch_capacity=1,
                            token_capacity=512, calls=1, mean_gpu_ms=12.0, max_gpu_ms=12.0)
        snapshot.graphs.add(kind="decode", label="b16", batch_capacity=16)
        if request.include_requests:
            for i in range(self.num_requests):
                snapshot.requests.add(slot=i, generation=1,
                                      phase="decode" if i != 8 else "prefill",
                                      prompt_consumed=128, prompt_len=128, output_tokens=10 + i,
                                      gap_ms=5.0, out_ms=5.0, bursts=3)
        cursor = request.completions_after if request.HasField("completions_after") else 0
        snapshot.completions.extend(r for r in self.records if r.sequence > cursor)
        return snapshot


async def _main(listen: str, num_requests: int) -> None:
    server = grpc.aio.server()
    engine_pb2_grpc.add_EngineServicer_to_server(FakeEngine(num_requests), server)
    server.add_insecure_port(listen)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    asyncio.run(_main(args.listen, args.requests))
